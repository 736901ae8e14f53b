"""A node of one's own beside the running stack (clients, tools, the demo, tests)."""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import rclpy
from rclpy.action import ActionClient, ActionServer
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.signals import SignalHandlerOptions

from twinloop_twin.workcell import default_config_dir


class RosSession:
    """A node in its own context and domain, spun in a background thread.

    What a command-line tool, the demo or a test uses to talk to running nodes: subscribe
    and collect, wait for a condition, call a service, without owning the main thread.
    It installs no signal handlers: Ctrl-C stays a KeyboardInterrupt in the main thread,
    so a tool can still use the context to cancel its goal (rclpy's handler would shut
    the context down first).
    """

    def __init__(self, domain_id: int | None = None, name: str = "twinloop_session") -> None:
        os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE",
                              str(default_config_dir() / "fastdds_localhost.xml"))
        os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        if domain_id is None:
            domain_id = int(os.environ.get("ROS_DOMAIN_ID", "0") or 0)
        self.domain_id = domain_id
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id, signal_handler_options=SignalHandlerOptions.NO)
        self.node = Node(name, context=self.context)
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set() and self.context.ok():
            try:
                self._executor.spin_once(timeout_sec=0.05)
            except AttributeError as error:
                # rclpy adds an action client or server to the node before its constructor
                # has set `_lock`; an executor waking in between (this thread, while the
                # caller's thread creates one) fails on it: 'ActionClient' object has no
                # attribute '_lock'. The next spin sees the finished object.
                if error.name == "_lock" and isinstance(error.obj, (ActionClient, ActionServer)):
                    continue
                raise

    def collect(self, msg_type, topic: str, qos: QoSProfile | int = 10,
                transform: Callable[[Any], Any] | None = None) -> list:
        """Subscribe and return the (growing) list of (receive_time, message-or-transform)."""
        received: list = []

        def on_message(msg) -> None:
            received.append((time.monotonic(), transform(msg) if transform else msg))
        self.node.create_subscription(msg_type, topic, on_message, qos)
        return received

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.02)
        raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")

    def call(self, srv_type, name: str, request, timeout_s: float = 30.0):
        """Call a service and wait for its response (the spinning thread delivers it)."""
        client = self.node.create_client(srv_type, name)
        if not client.wait_for_service(timeout_sec=timeout_s):
            raise TimeoutError(f"service {name} is not available after {timeout_s} s")
        future = client.call_async(request)
        self.wait_for(future.done, timeout_s, f"{name} response")
        return future.result()

    def close(self) -> None:
        # Join the spinning thread before shutdown, or the process aborts.
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._executor.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


# The name the tests have always used.
RosProbe = RosSession
