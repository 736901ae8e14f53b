"""Calibration data sets on disk: the ros-industrial industrial_calibration layout, and a
folder of images with a robot pose file.

Pure Python (no rclpy). A `cal_data.yaml` lists image/pose pairs (`data: [{pose, image}]`,
each pose a YAML of x y z qx qy qz qw in metres, the robot's base_T_mount at that image),
the target (`target_finder`) and nominal intrinsics.

A folder (`load_folder`) is what most users have: the images, and a text file with one line
per image, `<image file> x y z qx qy qz qw` or `<image file>` and the 16 numbers of the 4x4
base_T_gripper row by row; translations in the units the caller states (m or mm); `#`
starts a comment. Any target of `config/calibration_targets.yaml` (ChArUco, chessboard,
circle grid); intrinsics from a ROS camera_info YAML (camera_calibration's format) or
calibrated from the same views.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml

from twinloop_calibration import se3
from twinloop_calibration.degeneracy import DegenerateData
from twinloop_calibration.handeye import Progress, View, pair_views
from twinloop_calibration.intrinsics import CameraModel, IntrinsicsError, calibrate_intrinsics
from twinloop_calibration.targets import Detection, TargetDetector, TargetNotFound, TargetSpec


class DatasetError(FileNotFoundError):
    """A data set file is missing or malformed; the message names the file, the key and what is allowed."""


# Keys of industrial_calibration's cal_data.yaml (its examples and GUI loader); anything
# else is a typo, refused by name rather than ignored.
KNOWN_KEYS = ("data", "target_finder", "intrinsics", "camera_mount_to_camera_guess", "target_mount_to_target_guess",
              "homography_threshold", "static_camera", "use_extrinsic_guesses", "use_opencv")
TARGET_FINDER_KEYS = ("type", "rows", "cols", "spacing", "circle_detector_params")
POSE_KEYS = ("x", "y", "z", "qx", "qy", "qz", "qw")
POSE_UNITS = {"m": 1.0, "mm": 1e-3}


@dataclass(frozen=True)
class Dataset:
    views: list[View]
    camera: CameraModel  # the nominal intrinsics the data set states
    target: TargetSpec
    not_found: list[str]  # images where the target was not found
    static_camera: bool


def load_industrial_calibration(cal_data: Path | str, *, min_views: int = 5,
                                progress: Progress = lambda stage, done, total: None) -> Dataset:
    path = Path(cal_data)
    raw = _read_yaml(path, "the data set")
    if not isinstance(raw, dict):
        raise DatasetError(f"{path}: expected a mapping with 'data', 'target_finder' and 'intrinsics'")
    unknown = sorted(str(k) for k in raw if k not in KNOWN_KEYS)
    if unknown:
        raise DatasetError(f"{path}: unknown keys {unknown}; an industrial_calibration cal_data.yaml has "
                           f"{list(KNOWN_KEYS)}")
    if not isinstance(raw.get("data"), list) or not raw["data"]:
        raise DatasetError(f"{path}: expected a non-empty 'data' list of {{pose, image}} entries")
    finder = _section(path, raw, "target_finder")
    unknown = sorted(str(k) for k in finder if k not in TARGET_FINDER_KEYS)
    if unknown:
        raise DatasetError(f"{path}: unknown keys {unknown} in target_finder; known: {list(TARGET_FINDER_KEYS)}")
    kind = finder.get("type")
    if not isinstance(kind, str) or "CircleGrid" not in kind:
        raise DatasetError(f"{path}: target_finder type {kind!r} is not supported; only (modified) circle grids")
    cols, rows = (_whole(path, finder, key, "target_finder", low=2) for key in ("cols", "rows"))
    target = TargetSpec("cal_data_target", "circle_grid", cols, rows,
                        _number(path, finder, "spacing", "target_finder", positive=True),
                        origin_marker="large_dot" if "Modified" in kind else "none")
    intrinsics = _section(path, raw, "intrinsics")
    fx, fy = (_number(path, intrinsics, key, "intrinsics", positive=True) for key in ("fx", "fy"))
    cx, cy = (_number(path, intrinsics, key, "intrinsics") for key in ("cx", "cy"))
    camera_matrix = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
    for key in ("camera_mount_to_camera_guess", "target_mount_to_target_guess"):
        if key in raw:
            _pose_values(path, _section(path, raw, key), key)
    if "homography_threshold" in raw:
        _number(path, raw, "homography_threshold", "", positive=True)
    for key in ("static_camera", "use_extrinsic_guesses", "use_opencv"):
        if key in raw and not isinstance(raw[key], bool):
            raise DatasetError(f"{path}: '{key}' must be true or false, got {raw[key]!r}")
    detector = TargetDetector(target)
    poses, detections, labels = [], [], []
    size = (0, 0)
    for i, entry in enumerate(raw["data"]):
        progress("detecting", i, len(raw["data"]))
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) and entry[k] for k in ("pose", "image")):
            raise DatasetError(f"{path}: data[{i}] needs both 'pose' and 'image' (file names), got {entry!r}")
        poses.append(_pose(path.parent / entry["pose"]))
        detection, size = _detect(path.parent / entry["image"], detector, f"data[{i}] of {path}")
        detections.append(detection)
        labels.append(entry["image"])
    views, not_found = _paired(poses, detections, labels, min_views, "the target")
    return Dataset(views, CameraModel(camera_matrix, np.zeros(5), *size), target, not_found,
                   bool(raw.get("static_camera", False)))


def _detect(path: Path, detector: TargetDetector, where: str) -> tuple[Detection | None, tuple[int, int]]:
    """The target in one image file (None: not found) and the image's (width, height)."""
    image = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE) if path.is_file() else None
    if image is None:
        raise DatasetError(f"cannot read image {path} ({where}): missing or not an image")
    try:
        return detector.detect(image), (image.shape[1], image.shape[0])
    except TargetNotFound:
        return None, (image.shape[1], image.shape[0])


def _paired(poses, detections, labels: list[str], min_views: int, what: str) -> tuple[list[View], list[str]]:
    views, not_found = pair_views(poses, detections, labels)
    if len(views) < min_views:
        raise DegenerateData(f"{what} was found in {len(views)} of {len(labels)} images ({min_views} needed); "
                             f"not found in {not_found}")
    return views, not_found


def _read_yaml(path: Path, what: str):
    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as error:
        why = " ".join(str(error).split())
        raise DatasetError(f"cannot read {what} {path}: {why}") from error


def _section(path: Path, raw: dict, key: str) -> dict:
    if key not in raw:
        raise DatasetError(f"{path}: '{key}' is missing; the data set must state it (see industrial_calibration's "
                           "cal_data.yaml)")
    if not isinstance(raw[key], dict):
        raise DatasetError(f"{path}: '{key}' must be a mapping, got {raw[key]!r}")
    return raw[key]


def _number(path: Path, raw: dict, key: str, section: str, *, positive: bool = False) -> float:
    where = f"{section}.{key}" if section else key
    if key not in raw:
        raise DatasetError(f"{path}: '{where}' is missing")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or positive and value <= 0:
        raise DatasetError(f"{path}: '{where}' must be a finite{' positive' if positive else ''} number, "
                           f"got {value!r}")
    return float(value)


def _whole(path: Path, raw: dict, key: str, section: str, *, low: int) -> int:
    if key not in raw:
        raise DatasetError(f"{path}: '{section}.{key}' is missing")
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DatasetError(f"{path}: '{section}.{key}' must be a whole number >= {low}, got {value!r}")
    return value


def _pose_values(path: Path, raw: dict, what: str) -> list[float]:
    """x y z qx qy qz qw, finite, with a unit quaternion (metres)."""
    unknown = sorted(str(k) for k in raw if k not in POSE_KEYS)
    if unknown:
        raise DatasetError(f"{path}: unknown keys {unknown} in {what}; a pose has {list(POSE_KEYS)}")
    values = [_number(path, raw, key, "" if what == "the pose" else what) for key in POSE_KEYS]
    norm = math.sqrt(sum(v * v for v in values[3:]))
    if abs(norm - 1.0) > 1e-3:
        raise DatasetError(f"{path}: the quaternion of {what} has norm {norm:.6f}; it must be a unit quaternion")
    return values


def _pose(path: Path) -> np.ndarray:
    raw = _read_yaml(path, "pose")
    if not isinstance(raw, dict):
        raise DatasetError(f"{path}: a pose file holds x y z qx qy qz qw (metres), got {raw!r}")
    values = _pose_values(path, raw, "the pose")
    return se3.from_xyz_quat(values[:3], values[3:])


def load_folder(images: Path | str, poses: Path | str, target: TargetSpec, *, camera: CameraModel | None = None,
                pose_units: str = "m", min_views: int = 5,
                progress: Progress = lambda stage, done, total: None) -> Dataset:
    """Views from a folder of images and a pose file (see the module docstring); `camera`
    None: intrinsics calibrated from the same views (`Dataset.camera` is then that model)."""
    images, poses = Path(images), Path(poses)
    if pose_units not in POSE_UNITS:
        raise DatasetError(f"pose units {pose_units!r} are not known; use one of {list(POSE_UNITS)}")
    if not images.is_dir():
        raise DatasetError(f"{images} is not a folder of images")
    entries = _pose_lines(poses, POSE_UNITS[pose_units])
    detector = TargetDetector(target)
    transforms, detections, labels = [], [], []
    size = None
    for i, (name, pose) in enumerate(entries):
        progress("detecting", i, len(entries))
        detection, image_size = _detect(images / name, detector, f"named in {poses}")
        if size is not None and image_size != size:
            raise DatasetError(f"{images / name} is {image_size[0]}x{image_size[1]} px, the images before it "
                               f"{size[0]}x{size[1]}: every image must come from the same camera mode")
        size = image_size
        transforms.append(pose)
        detections.append(detection)
        labels.append(name)
    views, not_found = _paired(transforms, detections, labels, min_views, f"the target '{target.name}'")
    if camera is None:
        try:
            camera = calibrate_intrinsics([v.detection for v in views], size)
        except IntrinsicsError as error:
            raise DegenerateData(f"{error}; or give the camera's intrinsics (a camera_info YAML)") from error
    elif camera.width and (camera.width, camera.height) != size:
        raise DatasetError(f"the intrinsics are for {camera.width}x{camera.height} px, the images are "
                           f"{size[0]}x{size[1]}: give the intrinsics of this camera mode")
    return Dataset(views, camera, target, not_found, False)


def _pose_lines(path: Path, metres_per_unit: float) -> list[tuple[str, np.ndarray]]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise DatasetError(f"cannot read the pose file {path}: {' '.join(str(error).split())}") from error
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].replace(",", " ").split()
        if not fields:
            continue
        where = f"{path}:{number}"
        try:
            values = [float(v) for v in fields[1:]]
        except ValueError:
            raise DatasetError(f"{where}: expected '<image file>' and 7 numbers (x y z qx qy qz qw) or 16 (a 4x4 "
                               f"row by row), got {line.strip()!r}") from None
        if len(values) not in (7, 16) or not all(math.isfinite(v) for v in values):
            raise DatasetError(f"{where}: expected '<image file>' and 7 finite numbers (x y z qx qy qz qw) or 16 "
                               f"(a 4x4 row by row), got {len(values)} in {line.strip()!r}")
        if len(values) == 7:
            quaternion = np.array(values[3:])
            if abs(np.linalg.norm(quaternion) - 1.0) > 1e-3:
                raise DatasetError(f"{where}: the quaternion has norm {np.linalg.norm(quaternion):.6f}; it must be "
                                   "a unit quaternion (qx qy qz qw)")
            pose = se3.from_xyz_quat(np.array(values[:3]) * metres_per_unit, quaternion)
        else:
            pose = np.array(values).reshape(4, 4)
            rotation = pose[:3, :3]
            if not np.allclose(pose[3], [0, 0, 0, 1], atol=1e-9) or \
                    np.abs(rotation.T @ rotation - np.eye(3)).max() > 1e-3 or np.linalg.det(rotation) < 0:
                raise DatasetError(f"{where}: the 4x4 is not a rigid transform (last row 0 0 0 1, a rotation "
                                   "with orthonormal columns and determinant +1)")
            pose[:3, 3] *= metres_per_unit
        out.append((fields[0], pose))
    if not out:
        raise DatasetError(f"{path}: no poses; one line per image: '<image file> x y z qx qy qz qw'")
    names = [name for name, _ in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DatasetError(f"{path}: images with more than one pose: {repeated}")
    return out


def load_camera_info_yaml(path: Path | str) -> CameraModel:
    """Intrinsics from a ROS camera_info YAML (camera_calibration's: image_width,
    image_height, camera_matrix.data, distortion_coefficients.data)."""
    path = Path(path)
    raw = _read_yaml(path, "the intrinsics")
    try:
        matrix = np.asarray(raw["camera_matrix"]["data"], dtype=float).reshape(3, 3)
        distortion = np.asarray(raw.get("distortion_coefficients", {}).get("data", [0.0] * 5), dtype=float).ravel()
        width, height = int(raw["image_width"]), int(raw["image_height"])
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise DatasetError(f"{path}: expected a camera_info YAML with image_width, image_height, "
                           f"camera_matrix.data (9 numbers) and distortion_coefficients.data ({error!r})") from None
    if not (np.all(np.isfinite(matrix)) and np.all(np.isfinite(distortion))) or matrix[0, 0] <= 0 \
            or matrix[1, 1] <= 0 or width <= 0 or height <= 0:
        raise DatasetError(f"{path}: the intrinsics must be finite with positive focal lengths and image size")
    if np.any(distortion[5:] != 0):
        raise DatasetError(f"{path}: {distortion.size} distortion coefficients; only plumb_bob (k1 k2 p1 p2 k3) "
                           "is supported")
    padded = np.zeros(5)
    padded[:min(5, distortion.size)] = distortion[:5]
    return CameraModel(matrix, padded, width, height)
