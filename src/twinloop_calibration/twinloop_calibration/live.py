"""Pieces of a live calibration run that need no ROS: moves, settling, the session's views.

Pure Python (no rclpy). The node feeds joint states and images in and publishes what
these functions return.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from twinloop_twin.motion import minimum_jerk

COMMAND_PERIOD_S = 0.004  # the envelope monitor's command period: one message is one step


def move_duration_s(start: np.ndarray, goal: np.ndarray, max_speed_rad_s: float) -> float:
    """Minimum-jerk duration whose peak joint speed (1.875 x mean) stays under max_speed."""
    return max(0.5, 1.875 * float(np.max(np.abs(goal - start))) / max_speed_rad_s)


def move_targets(start: np.ndarray, goal: np.ndarray, max_speed_rad_s: float,
                 period_s: float = COMMAND_PERIOD_S) -> list[np.ndarray]:
    duration = move_duration_s(start, goal, max_speed_rad_s)
    steps = int(np.ceil(duration / period_s))
    return [minimum_jerk(start, goal, duration, (k + 1) * period_s) for k in range(steps)]


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


@dataclass
class JointBuffer:
    """Recent joint states (stamp, arm positions, arm velocities), thread-safe."""

    joints: list[str]
    maxlen: int = 2500  # 5 s at 500 Hz
    _samples: deque = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self._samples = deque(maxlen=self.maxlen)

    def add(self, stamp_ns: int, names, positions, velocities) -> None:
        index = {n: i for i, n in enumerate(names)}
        if not all(j in index for j in self.joints):
            return
        q = np.array([positions[index[j]] for j in self.joints])
        v = np.array([velocities[index[j]] for j in self.joints]) if len(velocities) == len(names) else np.zeros(len(q))
        with self._lock:
            self._samples.append((stamp_ns, q, v))

    def latest(self):
        with self._lock:
            return self._samples[-1] if self._samples else None

    def at(self, stamp_ns: int, tolerance_s: float = 0.05) -> np.ndarray | None:
        """Positions interpolated at stamp_ns; None if the buffer does not cover it."""
        with self._lock:
            samples = list(self._samples)
        if not samples or stamp_ns < samples[0][0] - tolerance_s * 1e9 or stamp_ns > samples[-1][0] + tolerance_s * 1e9:
            return None
        stamps = np.array([s[0] for s in samples], dtype=np.int64)
        q = np.array([s[1] for s in samples])
        t = (stamps - stamps[0]) * 1e-9
        return np.array([np.interp((stamp_ns - stamps[0]) * 1e-9, t, q[:, j]) for j in range(q.shape[1])])

    def settled(self, target: np.ndarray, *, since_ns: int, position_tolerance: float,
                velocity_tolerance: float) -> bool:
        """Every sample after since_ns is near the target and slow."""
        with self._lock:
            recent = [s for s in self._samples if s[0] >= since_ns]
        if len(recent) < 10:
            return False
        return all(np.max(np.abs(q - target)) < position_tolerance and np.max(np.abs(v)) < velocity_tolerance
                   for _, q, v in recent)
