"""Where calibration views come from: a recorded bag, or the configuration around a live run.

Pure Python (no rclpy). Bags are read with twinloop_logging.bag_reader; joint states are
interpolated at every image's stamp and turned into gripper poses by forward kinematics.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from twinloop_calibration.degeneracy import CalibrationError, DegenerateData
from twinloop_calibration.handeye import View
from twinloop_calibration.intrinsics import CameraModel, from_camera_info
from twinloop_calibration.pose_planner import PlannerLimits
from twinloop_calibration.targets import TargetDetector, TargetNotFound
from twinloop_calibration.time_offset import SEARCH_S, TimeOffsetResult, estimate_time_offset, shift_views


class SourceError(CalibrationError):
    code = "FILE_NOT_FOUND"


@dataclass(frozen=True)
class BagViews:
    views: list[View]
    camera: CameraModel
    images_total: int
    not_found: int
    time_offset: TimeOffsetResult | None


def views_from_bag(path: Path | str, *, camera_name: str, detector: TargetDetector, joint_names: list[str],
                   forward_kinematics: Callable[[np.ndarray], np.ndarray], setup: str,
                   max_frames: int = 60, estimate_offset: bool = True) -> BagViews:
    """Views of one camera from a bag: /<camera>/color/image_raw, its camera_info, /joint_states."""
    try:
        from twinloop_logging.bag_reader import BagError, open_bag
    except ImportError as error:
        raise SourceError(f"reading bags needs twinloop_logging ({error}); install the workspace "
                          "(tools/setup.sh) or use the live source") from error
    try:
        with open_bag(path) as bag:
            joints = bag.joint_states("/joint_states", joint_names)
            info = bag.camera_info(f"/{camera_name}/color/camera_info")
            # Spread the frames read over the whole session (the index's count, which every bag
            # has), not the first max_frames: a session starts with the arm at rest.
            count = bag.require(f"/{camera_name}/color/image_raw").count
            every = max(1, count // max_frames)
            images = bag.images(f"/{camera_name}/color/image_raw", every=every, max_frames=max_frames)
    except BagError as error:
        raise SourceError(f"cannot read the calibration bag {path}: {error}") from error
    # Messages without the arm's joints (a gripper publishing its own) or with non-finite
    # positions cannot place the gripper: left out; too few left is an error.
    keep = np.isfinite(joints.position).all(axis=1) if joints.position.size else np.zeros(0, dtype=bool)
    if keep.sum() < 2:
        raise SourceError(f"the calibration bag {path} has {int(keep.sum())} /joint_states messages with finite "
                          f"positions of {joint_names} (of {len(keep)}); record the calibration with the robot's "
                          "joint states")
    joints = type(joints)(joints.stamps_ns[keep], joints.names, joints.position[keep], joints.velocity[keep],
                          joints.effort[keep])
    if not np.isfinite(info.k[-1]).all() or info.k[-1][0, 0] <= 0 or info.k[-1][1, 1] <= 0:
        raise SourceError(f"/{camera_name}/color/camera_info in {path} has no usable intrinsics (K = "
                          f"{info.k[-1].ravel().tolist()}); record the camera's calibrated camera_info")
    camera = from_camera_info(info.k[-1].ravel(), info.d[-1], info.width, info.height)
    # A frame is paired with the robot's pose at its stamp + an offset searched over
    # +-SEARCH_S: frames stamped closer than that to either end of the joint-state record
    # (a recording's first camera frames can come before its first joint state: 0.12 s in
    # one) cannot be, and are left out (the arm is at rest there).
    first, last = int(joints.stamps_ns[0]), int(joints.stamps_ns[-1])
    margin_ns = int(SEARCH_S * 1e9) if estimate_offset else 0
    framed = [(stamp, frame) for stamp, frame in zip(images.stamps_ns, images.frames)
              if first + margin_ns <= stamp <= last - margin_ns]
    stamps, detections = [], []
    for stamp, frame in framed:
        try:
            detections.append(detector.detect(frame))
            stamps.append(int(stamp))
        except TargetNotFound:
            continue
    if len(detections) < 3:
        raise DegenerateData(f"the target was found in {len(detections)} of {len(framed)} images of "
                             f"/{camera_name}/color/image_raw in {path}; record with the target in view")
    times = (joints.stamps_ns - joints.stamps_ns[0]) * 1e-9
    t0 = joints.stamps_ns[0]
    image_times = [(s - t0) * 1e-9 for s in stamps]
    views = [View(forward_kinematics(np.array([np.interp(t, times, joints.position[:, j])
                                               for j in range(len(joint_names))])), d, t, str(i))
             for i, (t, d) in enumerate(zip(image_times, detections))]
    offset = None
    if estimate_offset:
        offset = estimate_time_offset(setup, image_times, detections, times, joints.position,
                                      forward_kinematics, camera)
        if offset.observable:
            views = shift_views(views, offset.offset_s, times, joints.position, forward_kinematics)
    return BagViews(views, camera, len(images.stamps_ns), len(framed) - len(detections), offset)


def planner_limits_from_envelope(path: Path | str, base: PlannerLimits) -> PlannerLimits:
    """Tighten the planner's workspace and joint margin with the envelope monitor's parameters,
    so planned poses never trip the envelope."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SourceError(f"cannot read the envelope parameters {path}: {error}") from error
    if raw is not None and not isinstance(raw, dict):
        raise SourceError(f"{path}: expected a mapping of node names to their ros__parameters")
    section = next((v.get("ros__parameters", {}) for k, v in (raw or {}).items()
                    if str(k).endswith("envelope_monitor") and isinstance(v, dict)), {})
    if not section:
        return base
    try:
        margin = float(section.get("cartesian_margin_m", 0.0)) + 0.03
        low = np.maximum(base.workspace_min_m,
                         np.asarray(section.get("workspace_min", base.workspace_min_m), dtype=float) + margin)
        high = np.minimum(base.workspace_max_m,
                          np.asarray(section.get("workspace_max", base.workspace_max_m), dtype=float) - margin)
        joint_margin = max([base.joint_margin_rad,
                            *[float(m) + 0.05 for m in list(section.get("position_margins", []))[:7]]])
    except (TypeError, ValueError) as error:
        raise SourceError(f"{path}: envelope_monitor parameters cartesian_margin_m, workspace_min/max and "
                          f"position_margins must be numbers ({error})") from error
    if not (np.isfinite(low).all() and np.isfinite(high).all() and np.isfinite(joint_margin)) \
            or low.shape != (3,) or high.shape != (3,):
        raise SourceError(f"{path}: the envelope's workspace and margins must be finite (x, y, z) values")
    return PlannerLimits(tuple(float(v) for v in low), tuple(float(v) for v in high), joint_margin,
                         base.image_margin_px, base.distance_m, base.max_tilt_deg, base.max_roll_deg)
