"""Scripted joint motions and what to measure about them. Pure Python (no rclpy)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np


def minimum_jerk(start: np.ndarray, goal: np.ndarray, duration_s: float, t: float) -> np.ndarray:
    """Position on the minimum-jerk path from start to goal (rest to rest) at time t."""
    s = np.clip(t / duration_s, 0.0, 1.0)
    return start + (goal - start) * (10 * s**3 - 15 * s**4 + 6 * s**5)


@dataclass(frozen=True)
class ScriptedMotion:
    """Rest-to-rest minimum-jerk segments through joint-space waypoints."""

    joint_names: tuple[str, ...]
    waypoints: np.ndarray  # (k, n) rad; the first is the start pose
    segment_s: float  # duration of each segment

    @property
    def duration_s(self) -> float:
        return self.segment_s * (len(self.waypoints) - 1)

    def at(self, t: float) -> np.ndarray:
        index = min(int(t // self.segment_s), len(self.waypoints) - 2)
        return minimum_jerk(self.waypoints[index], self.waypoints[index + 1], self.segment_s,
                            t - index * self.segment_s)


def demo_motion(home: Mapping[str, float], joint_names: Sequence[str], segment_s: float = 2.0) -> ScriptedMotion:
    """A short tour around the home pose that moves every arm joint by 0.2-0.4 rad."""
    start = np.array([home[j] for j in joint_names])
    offsets = np.array([
        [0.0] * 7,
        [0.35, 0.25, -0.2, 0.3, 0.3, -0.3, 0.4],
        [-0.35, -0.2, 0.25, -0.25, -0.3, 0.3, -0.4],
        [0.0] * 7,
    ])[:, : len(joint_names)]
    return ScriptedMotion(tuple(joint_names), start + offsets, segment_s)


@dataclass(frozen=True)
class TrackingReport:
    rms_rad: dict[str, float]
    max_rad: dict[str, float]
    latency_s: float  # shift that best aligns measured with commanded positions


def tracking_report(command_t: np.ndarray, command_q: np.ndarray, state_t: np.ndarray,
                    state_q: np.ndarray, joint_names: Sequence[str],
                    max_latency_s: float = 0.2, resolution_s: float = 0.001) -> TrackingReport:
    """Tracking error of measured vs commanded positions, and the best-aligning latency.

    Commands and states are (time, n-joint) arrays on the same clock. The latency is the
    shift of the command stream that minimises the squared error (delay + servo lag).
    """
    inside = (state_t >= command_t[0]) & (state_t <= command_t[-1])
    t, q = state_t[inside], state_q[inside]

    def commanded(shift: float) -> np.ndarray:
        return np.stack([np.interp(t - shift, command_t, command_q[:, j], left=command_q[0, j])
                         for j in range(command_q.shape[1])], axis=1)

    shifts = np.arange(0.0, max_latency_s, resolution_s)
    costs = [float(np.mean((q - commanded(s)) ** 2)) for s in shifts]
    latency = float(shifts[int(np.argmin(costs))])
    error = q - commanded(0.0)
    return TrackingReport(
        rms_rad={n: float(np.sqrt(np.mean(error[:, j] ** 2))) for j, n in enumerate(joint_names)},
        max_rad={n: float(np.max(np.abs(error[:, j]))) for j, n in enumerate(joint_names)},
        latency_s=latency,
    )


def rate_hz(stamps_s: np.ndarray) -> float:
    if len(stamps_s) < 2:
        return 0.0
    return (len(stamps_s) - 1) / float(stamps_s[-1] - stamps_s[0])


def period_jitter_ms(stamps_s: np.ndarray) -> tuple[float, float]:
    """(p50, p99) of the period between consecutive stamps, in ms."""
    periods = np.diff(np.asarray(stamps_s)) * 1e3
    return float(np.percentile(periods, 50)), float(np.percentile(periods, 99))
