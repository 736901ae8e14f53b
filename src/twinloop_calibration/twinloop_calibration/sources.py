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
from twinloop_calibration.time_offset import TimeOffsetResult, estimate_time_offset, shift_views


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
            count = bag.topic_stats().get(f"/{camera_name}/color/image_raw", {}).get("count", 0)
            every = max(1, int(count) // max_frames) if count else 1
            images = bag.images(f"/{camera_name}/color/image_raw", every=every, max_frames=max_frames)
    except BagError as error:
        raise SourceError(f"cannot read the calibration bag {path}: {error}") from error
    camera = from_camera_info(info.k[-1].ravel(), info.d[-1], info.width, info.height)
    stamps, detections = [], []
    for stamp, frame in zip(images.stamps_ns, images.frames):
        try:
            detections.append(detector.detect(frame))
            stamps.append(int(stamp))
        except TargetNotFound:
            continue
    if len(detections) < 3:
        raise DegenerateData(f"the target was found in {len(detections)} of {len(images.stamps_ns)} images of "
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
    return BagViews(views, camera, len(images.stamps_ns), len(images.stamps_ns) - len(detections), offset)


def planner_limits_from_envelope(path: Path | str, base: PlannerLimits) -> PlannerLimits:
    """Tighten the planner's workspace and joint margin with the envelope monitor's parameters,
    so planned poses never trip the envelope."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise SourceError(f"cannot read the envelope parameters {path}: {error}") from error
    section = next((v.get("ros__parameters", {}) for k, v in (raw or {}).items() if k.endswith("envelope_monitor")), {})
    if not section:
        return base
    margin = float(section.get("cartesian_margin_m", 0.0)) + 0.03
    low = np.maximum(base.workspace_min_m, np.asarray(section.get("workspace_min", base.workspace_min_m)) + margin)
    high = np.minimum(base.workspace_max_m, np.asarray(section.get("workspace_max", base.workspace_max_m)) - margin)
    joint_margin = max([base.joint_margin_rad, *[float(m) + 0.05 for m in section.get("position_margins", [])[:7]]])
    return PlannerLimits(tuple(float(v) for v in low), tuple(float(v) for v in high), joint_margin,
                         base.image_margin_px, base.distance_m, base.max_tilt_deg, base.max_roll_deg)
