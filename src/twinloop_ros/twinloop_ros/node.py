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
from rclpy.task import Future


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


async def sleep(node: Node, seconds: float) -> None:
    """Await `seconds` in a coroutine callback without holding the executor thread."""
    done = Future()
    timer = node.create_timer(seconds, lambda: done.done() or done.set_result(None))
    try:
        await done
    finally:
        node.destroy_timer(timer)


async def await_worker(node: Node, work: Callable[[], Any], *, every: Callable[[], None] = lambda: None,
                       period_s: float = 0.05) -> Any:
    """Run the blocking `work` in a worker thread and return what it returns (or raise what
    it raises), from a coroutine callback (an action's execute): the executor thread stays
    free to deliver messages, timers and service responses meanwhile. `every` runs in the
    executor thread each period while the worker runs, and once after (relay feedback,
    pass on a cancel).

    Why not a MultiThreadedExecutor: rclpy's took a whole core here to deliver 39 of 500
    joint states a second, where one executor thread delivered all of them with 13-23 %
    (`python bench/executor_cost.py`)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # noqa: BLE001 - re-raised in the coroutine
            outcome["error"] = error
    worker = threading.Thread(target=target, name=f"{node.get_name()}_worker", daemon=True)
    worker.start()
    while worker.is_alive():
        every()
        await sleep(node, period_s)
    every()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


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
