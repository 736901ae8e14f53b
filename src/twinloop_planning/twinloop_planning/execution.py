"""Sending a planned trajectory: a fixed-period command stream that follows queued targets
and holds the last one without a break (the envelope monitor takes one message as one step
and faults on a silent stream). Pure Python (no rclpy): the caller gives `publish`.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

import numpy as np


class TargetStream:
    """What a fixed-rate command stream sends next: the queued path, then its last target
    held. The envelope monitor takes one message as one step and faults on a silent
    stream, so a calibration run streams without a break, holding while it takes images."""

    def __init__(self, hold: np.ndarray) -> None:
        self._lock = threading.Lock()
        self._queue: deque[np.ndarray] = deque()
        self._last = np.array(hold, dtype=float)

    def follow(self, targets: list[np.ndarray]) -> None:
        with self._lock:
            self._queue.extend(np.array(t, dtype=float) for t in targets)

    def next(self) -> np.ndarray:
        with self._lock:
            if self._queue:
                self._last = self._queue.popleft()
            return self._last.copy()

    @property
    def last(self) -> np.ndarray:
        with self._lock:
            return (self._queue[-1] if self._queue else self._last).copy()

    def remaining(self) -> int:
        """Targets queued and not yet sent."""
        with self._lock:
            return len(self._queue)

    def idle(self) -> bool:
        with self._lock:
            return not self._queue


def stream_targets(stream: TargetStream, publish: Callable[[np.ndarray], None], period_s: float,
                   stop: threading.Event) -> None:
    """Publish stream.next() every period_s on a fixed schedule until `stop` is set (run in a thread)."""
    begin = time.monotonic()
    tick = 0
    while not stop.is_set():
        publish(stream.next())
        tick += 1
        delay = begin + tick * period_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        elif delay < -0.1:  # stalled: restart the schedule rather than burst the missed steps
            begin, tick = time.monotonic(), 0
