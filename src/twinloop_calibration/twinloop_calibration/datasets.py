"""Calibration data sets on disk: the ros-industrial industrial_calibration layout.

Pure Python (no rclpy). A `cal_data.yaml` lists image/pose pairs (`data: [{pose, image}]`,
each pose a YAML of x y z qx qy qz qw in metres, the robot's base_T_mount at that image),
the target (`target_finder`) and nominal intrinsics.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml

from twinloop_calibration import se3
from twinloop_calibration.degeneracy import DegenerateData, InconsistentInput
from twinloop_calibration.handeye import View, pair_views
from twinloop_calibration.intrinsics import CameraModel
from twinloop_calibration.targets import TargetDetector, TargetNotFound, TargetSpec


class DatasetError(FileNotFoundError):
    """A data set file is missing or malformed; the message names it."""


@dataclass(frozen=True)
class Dataset:
    views: list[View]
    camera: CameraModel  # the nominal intrinsics the data set states
    target: TargetSpec
    not_found: list[str]  # images where the target was not found
    static_camera: bool


def load_industrial_calibration(cal_data: Path | str, *, min_views: int = 5) -> Dataset:
    path = Path(cal_data)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise DatasetError(f"cannot read {path}: {error}") from error
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), list):
        raise DatasetError(f"{path}: expected a 'data' list of {{pose, image}} entries")
    finder = raw.get("target_finder", {})
    if "CircleGrid" not in str(finder.get("type", "")):
        raise DatasetError(f"{path}: target_finder type {finder.get('type')!r} is not supported; "
                           "only (modified) circle grids")
    target = TargetSpec("cal_data_target", "circle_grid", int(finder["cols"]), int(finder["rows"]),
                        float(finder["spacing"]),
                        origin_marker="large_dot" if "Modified" in finder["type"] else "none")
    intrinsics = raw.get("intrinsics", {})
    camera_matrix = np.array([[intrinsics["fx"], 0.0, intrinsics["cx"]], [0.0, intrinsics["fy"], intrinsics["cy"]],
                              [0.0, 0.0, 1.0]], dtype=float)
    detector = TargetDetector(target)
    poses, detections, labels = [], [], []
    size = (0, 0)
    for entry in raw["data"]:
        if not isinstance(entry, dict) or "pose" not in entry or "image" not in entry:
            raise InconsistentInput(f"{path}: every data entry needs both 'pose' and 'image', got {entry!r}")
        poses.append(_pose(path.parent / entry["pose"]))
        image_path = path.parent / entry["image"]
        image = cv2.imread(str(image_path), cv2.IMREAD_GRAYSCALE)
        if image is None:
            raise DatasetError(f"cannot read image {image_path}")
        size = (image.shape[1], image.shape[0])
        labels.append(entry["image"])
        try:
            detections.append(detector.detect(image))
        except TargetNotFound:
            detections.append(None)
    views, not_found = pair_views(poses, detections, labels)
    if len(views) < min_views:
        raise DegenerateData(f"the target was found in {len(views)} of {len(labels)} images ({min_views} needed); "
                             f"not found in {not_found}")
    return Dataset(views, CameraModel(camera_matrix, np.zeros(5), *size), target, not_found,
                   bool(raw.get("static_camera", False)))


def _pose(path: Path) -> np.ndarray:
    try:
        raw = yaml.safe_load(path.read_text())
        return se3.from_xyz_quat([raw["x"], raw["y"], raw["z"]], [raw["qx"], raw["qy"], raw["qz"], raw["qw"]])
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise DatasetError(f"cannot read pose {path} (x y z qx qy qz qw): {error}") from error
