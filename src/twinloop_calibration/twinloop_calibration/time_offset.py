"""Time offset between camera and joint-state clocks, estimated with the calibration.

Pure Python (no rclpy). When views are taken while the robot moves (streamed data), a
camera stamp that is late or early by dt pairs each image with the wrong robot pose. The
offset is the dt that minimises the hand-eye reprojection cost when every image is paired
with the joint state at (image stamp + dt); its standard deviation comes from the cost's
curvature. Views taken at rest carry no information about dt, and the result says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import minimize_scalar

from twinloop_calibration.degeneracy import InconsistentInput
from twinloop_calibration.handeye import Setup, View, _group, _initial, _Problem
from twinloop_calibration.intrinsics import CameraModel
from twinloop_calibration.targets import Detection


SEARCH_S = 0.1  # s: the offsets tried lie in [-SEARCH_S, SEARCH_S]


@dataclass(frozen=True)
class TimeOffsetResult:
    offset_s: float  # add to the image stamps to get the joint-state time of the image
    std_s: float
    observable: bool
    reason: str
    grid_s: tuple[float, ...] = ()
    grid_cost: tuple[float, ...] = ()


def interpolate_positions(times_s: np.ndarray, positions: np.ndarray, at_s: float) -> np.ndarray:
    """Joint positions at `at_s`, linear between samples (joint states come at >= 500 Hz)."""
    if at_s < times_s[0] or at_s > times_s[-1]:
        raise InconsistentInput(f"time {at_s:.3f} s is outside the joint-state record "
                                f"[{times_s[0]:.3f}, {times_s[-1]:.3f}] s; record joint states over the whole capture")
    return np.array([np.interp(at_s, times_s, positions[:, j]) for j in range(positions.shape[1])])


def estimate_time_offset(setup: Setup | str, image_stamps_s: Sequence[float], detections: Sequence[Detection],
                         joint_times_s: np.ndarray, joint_positions: np.ndarray,
                         forward_kinematics: Callable[[np.ndarray], np.ndarray], camera: CameraModel, *,
                         search_s: float = SEARCH_S, step_s: float = 0.005,
                         min_motion_px: float = 0.2) -> TimeOffsetResult:
    """forward_kinematics(joint positions) -> base_T_gripper."""
    setup = Setup(setup)
    if len(image_stamps_s) != len(detections):
        raise InconsistentInput(f"{len(image_stamps_s)} image stamps but {len(detections)} detections")
    joint_times_s = np.asarray(joint_times_s, dtype=float)
    joint_positions = np.asarray(joint_positions, dtype=float)
    lo = float(joint_times_s[0] - min(image_stamps_s)) + 1e-6
    hi = float(joint_times_s[-1] - max(image_stamps_s)) - 1e-6
    lo, hi = max(-search_s, lo), min(search_s, hi)
    if lo >= hi:
        raise InconsistentInput("the joint-state record does not cover the images +- the search window; "
                                "record joint states from before the first image to after the last")

    def views_at(offset: float) -> list[View]:
        return [View(forward_kinematics(interpolate_positions(joint_times_s, joint_positions, t + offset)), d)
                for t, d in zip(image_stamps_s, detections)]

    start = 0.0 if lo <= 0.0 <= hi else 0.5 * (lo + hi)
    start_views = views_at(start)
    candidates, best = _initial(setup, start_views, camera)
    reference = {"x": candidates[best][0], "b": candidates[best][1]}

    def cost(offset: float) -> float:
        problem = _Problem([_group(setup, views_at(offset), camera)], dict(reference))
        theta = problem.solve(robust=False)
        residuals = problem.residuals(theta)
        return float(residuals @ residuals)

    # How far do image points move per step of offset? Views at rest say nothing about dt.
    problem = _Problem([_group(setup, start_views, camera)], reference)
    # One step on from the start, inside [lo, hi] as every offset tried here.
    probe = start + step_s if start + step_s <= hi else max(lo, start - step_s)
    shifted = _Problem([_group(setup, views_at(probe), camera)], reference)
    motion = np.sqrt(np.mean((problem.residuals(np.zeros(12)) - shifted.residuals(np.zeros(12))) ** 2) * 2)
    if motion < min_motion_px * step_s / 0.005:
        return TimeOffsetResult(0.0, float("inf"), False,
                                f"the robot is (nearly) at rest at the image times (image points move "
                                f"{motion:.3f} px per {step_s * 1e3:.0f} ms of offset): the offset is unobservable "
                                "from these views; it is observable from views taken while moving")
    grid = np.arange(lo, hi + 1e-12, step_s)
    costs = np.array([cost(t) for t in grid])
    k = int(np.argmin(costs))
    bracket = (grid[max(0, k - 1)], grid[min(len(grid) - 1, k + 1)])
    found = minimize_scalar(cost, bounds=bracket, method="bounded", options={"xatol": 1e-5})
    offset = float(found.x)
    # The curvature's stencil stays inside [lo, hi] like every offset tried: an optimum at
    # the edge of the joint-state record is differenced from inside it.
    h = min(max(step_s / 5, 1e-4), (hi - lo) / 2)
    centre = min(max(offset, lo + h), hi - h)
    at_centre = found.fun if centre == offset else cost(centre)
    curvature = (cost(centre + h) - 2 * at_centre + cost(centre - h)) / h ** 2
    residual_count = 2 * sum(len(d) for d in detections)
    sigma2 = found.fun / max(1, residual_count - 12)
    std = math.sqrt(2 * sigma2 / curvature) if curvature > 0 else float("inf")
    return TimeOffsetResult(offset, std, True, "estimated from views taken while moving",
                            tuple(float(g) for g in grid), tuple(float(c) for c in costs))


def shift_views(views: Sequence[View], offset_s: float, joint_times_s: np.ndarray, joint_positions: np.ndarray,
                forward_kinematics: Callable[[np.ndarray], np.ndarray]) -> list[View]:
    """Views re-paired with the robot pose at (image stamp + offset)."""
    return [View(forward_kinematics(interpolate_positions(joint_times_s, joint_positions, v.stamp_s + offset_s)),
                 v.detection, v.stamp_s, v.label) for v in views]

