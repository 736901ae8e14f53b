"""Helpers for tests, the demo and benchmarks that run real nodes over real DDS.

Every process started here gets a localhost-only DDS environment and its own domain id,
so that runs cannot hear each other or anything off this host.
"""
from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile

from twinloop_twin.workcell import default_config_dir

_domain_counter = itertools.count()


def fresh_domain_id() -> int:
    """A domain id unlikely to be in use by another test process on this host (1..200)."""
    return 1 + (os.getpid() * 7 + next(_domain_counter)) % 200


def localhost_env(domain_id: int, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ROS_DOMAIN_ID": str(domain_id),
        "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST",
        "FASTDDS_DEFAULT_PROFILES_FILE": str(default_config_dir() / "fastdds_localhost.xml"),
        "MUJOCO_GL": env.get("MUJOCO_GL", "egl"),
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra)
    return env


class NodeProcess:
    """A node started as a subprocess (`python -m module --ros-args ...`)."""

    def __init__(self, module: str, domain_id: int, parameters: dict[str, Any] | None = None,
                 env: dict[str, str] | None = None, log_path: Path | None = None,
                 extra_args: list[str] | None = None) -> None:
        args = [sys.executable, "-m", module, "--ros-args", *(extra_args or [])]
        for name, value in (parameters or {}).items():
            args += ["-p", f"{name}:={_param_text(value)}"]
        self.log_path = log_path
        self._log = open(log_path, "w") if log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(args, env=localhost_env(domain_id, **(env or {})),
                                        stdout=self._log, stderr=subprocess.STDOUT)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 10.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        return self.process.returncode

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path and self.log_path.exists() else ""


def _param_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class RosProbe:
    """A test-side node in its own context and domain, spun in a background thread."""

    def __init__(self, domain_id: int, name: str = "probe") -> None:
        os.environ.setdefault("FASTDDS_DEFAULT_PROFILES_FILE",
                              str(default_config_dir() / "fastdds_localhost.xml"))
        os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
        self.context = Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = Node(name, context=self.context)
        self._executor = SingleThreadedExecutor(context=self.context)
        self._executor.add_node(self.node)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        while not self._stop.is_set() and self.context.ok():
            self._executor.spin_once(timeout_sec=0.05)

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
