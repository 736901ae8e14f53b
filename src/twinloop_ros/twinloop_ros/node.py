"""What every twinloop node shares: parameter declaration, start-up and shutdown, executors."""
from __future__ import annotations

import signal
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

import rclpy
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions


class StartupError(RuntimeError):
    """The node cannot start; the message says what was wrong and what to do."""


def declare(node: Node, spec: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """Declare parameters {name: (default, description)} and read them once."""
    return {name: node.declare_parameter(name, default, ParameterDescriptor(description=text)).value
            for name, (default, text) in spec.items()}


class RateMeter:
    """Rate of an event over the last `window_s` seconds."""

    def __init__(self, window_s: float = 2.0) -> None:
        self._window_s = window_s
        self._times: deque[float] = deque()

    def tick(self) -> None:
        now = time.monotonic()
        self._times.append(now)
        while self._times and now - self._times[0] > self._window_s:
            self._times.popleft()

    def rate_hz(self) -> float:
        if len(self._times) < 2:
            return 0.0
        return (len(self._times) - 1) / (self._times[-1] - self._times[0])


def make_executor() -> Callable[[], Any]:
    """EventsExecutor where available: its timers are steady to ~0.5 ms at 500 Hz."""
    def factory():
        try:
            from rclpy.experimental import EventsExecutor
            return EventsExecutor()
        except ImportError:
            return SingleThreadedExecutor()
    return factory


def run_node(node_class: type[Node], args=None, *, executor: Callable[[], Any] | None = None) -> None:
    """init, spin, clean shutdown on Ctrl-C / SIGTERM / external shutdown; exit 2 on bad input.

    SIGINT and SIGTERM only raise a flag that the spin loop checks: an exception thrown
    into whatever callback happens to run (rclpy's default) would abort it half-way.
    """
    stop = threading.Event()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    node = None
    code = 0
    try:
        node = node_class()
        spinner = (executor or SingleThreadedExecutor)()
        spinner.add_node(node)
        # spin_once in a loop: EventsExecutor.spin() of the Kilted wheels never returns
        # and fires no timer, while its spin_once() keeps ~0.2 ms p99 timer jitter.
        while rclpy.ok() and not stop.is_set():
            spinner.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except StartupError as error:
        print(f"[{node_class.__name__}] ERROR: {error}", file=sys.stderr, flush=True)
        code = 2
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code:
        sys.exit(code)
