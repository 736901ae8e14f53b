"""Synthetic hand-eye data with known truth, for tests and the benchmark.

Pure Python (no rclpy). Views look at the target from a spherical cap, with random tilt
and roll; the image points are exact projections plus Gaussian pixel noise, and the
reported robot poses carry Gaussian translation and rotation error in the gripper frame.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from twinloop_calibration import se3
from twinloop_calibration.handeye import View
from twinloop_calibration.intrinsics import CameraModel
from twinloop_calibration.targets import Detection, TargetSpec

DEFAULT_TARGET = TargetSpec("synthetic_charuco", "charuco", 5, 7, 0.04, 0.03, "DICT_5X5_100")
DEFAULT_CAMERA = CameraModel(np.array([[615.0, 0.0, 322.5], [0.0, 615.0, 238.5], [0.0, 0.0, 1.0]]),
                             np.zeros(5), 640, 480)
# gripper_T_camera of a wrist camera 7.5 cm off the flange axis, looking along it.
DEFAULT_GRIPPER_T_CAMERA = se3.from_rotvec(np.array([0.02, -0.03, 1.5708]), np.array([0.075, 0.002, 0.03]))
DEFAULT_BASE_T_TARGET = se3.from_rotvec(np.array([np.pi, 0.0, 0.0]), np.array([0.45, 0.10, 0.003]))


@dataclass(frozen=True)
class SyntheticSet:
    views: list[View]
    camera: CameraModel
    x_true: np.ndarray  # gripper_T_camera (eye-in-hand) / base_T_camera (eye-to-hand)
    b_true: np.ndarray  # base_T_target / gripper_T_target
    base_T_gripper_true: list[np.ndarray]


def look_at(eye: np.ndarray, target: np.ndarray, roll: float) -> np.ndarray:
    """base_T_camera (optical: z forward, y down) at `eye` looking at `target`, rolled about z."""
    z = target - eye
    z /= np.linalg.norm(z)
    helper = np.array([1.0, 0.0, 0.0]) if abs(z[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
    x = np.cross(helper, z)
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    rotation = np.column_stack([x, y, z])
    return se3.make(rotation @ se3.from_rotvec([0, 0, roll], [0, 0, 0])[:3, :3], eye)


def eye_in_hand(*, views: int = 15, pixel_std: float = 0.5, robot_translation_std_m: float = 0.0005,
                robot_rotation_std_rad: float = float(np.radians(0.05)), seed: int = 0,
                camera: CameraModel = DEFAULT_CAMERA, target: TargetSpec = DEFAULT_TARGET,
                x_true: np.ndarray = DEFAULT_GRIPPER_T_CAMERA, b_true: np.ndarray = DEFAULT_BASE_T_TARGET,
                distance_m: tuple[float, float] = (0.3, 0.55), max_tilt_deg: float = 35.0,
                max_roll_deg: float = 60.0, rotation_axis: np.ndarray | None = None) -> SyntheticSet:
    """Wrist-camera views of a target fixed in the base frame.

    rotation_axis: if given, every view differs from the first only by a rotation about this
    gripper axis (a degenerate set, for tests)."""
    rng = np.random.default_rng(seed)
    points = target.object_points()
    centre = (b_true @ np.append(points.mean(axis=0), 1.0))[:3]
    normal = -b_true[:3, 2]  # the target's z points into the board; the camera sits on the other side
    out, truths = [], []
    first = None
    attempts = 0
    while len(out) < views:
        attempts += 1
        if attempts > 200 * views:
            raise RuntimeError("could not place synthetic views with the whole target in the image")
        if rotation_axis is not None and first is not None:
            angle = rng.uniform(-0.5, 0.5)
            base_T_gripper = first @ se3.from_rotvec(np.asarray(rotation_axis) * angle, np.zeros(3))
        else:
            tilt = np.radians(rng.uniform(0, max_tilt_deg))
            azimuth = rng.uniform(0, 2 * np.pi)
            helper = np.array([1.0, 0.0, 0.0]) if abs(normal[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
            u = np.cross(normal, helper)
            u /= np.linalg.norm(u)
            v = np.cross(normal, u)
            direction = np.cos(tilt) * normal + np.sin(tilt) * (np.cos(azimuth) * u + np.sin(azimuth) * v)
            eye = centre + rng.uniform(*distance_m) * direction
            aim = centre + rng.normal(0, 0.03, 3)
            base_T_camera = look_at(eye, aim, np.radians(rng.uniform(-max_roll_deg, max_roll_deg)))
            base_T_gripper = base_T_camera @ se3.inv(x_true)
        camera_T_target = se3.inv(x_true) @ se3.inv(base_T_gripper) @ b_true
        detection = _observe(camera, camera_T_target, points, pixel_std, rng)
        if detection is None:
            continue
        if first is None:
            first = base_T_gripper
        noise = np.concatenate([rng.normal(0, robot_translation_std_m, 3), rng.normal(0, robot_rotation_std_rad, 3)])
        out.append(View(se3.twist(base_T_gripper, noise), detection, label=str(len(out))))
        truths.append(base_T_gripper)
    return SyntheticSet(out, camera, x_true, b_true, truths)


def eye_to_hand(*, views: int = 15, pixel_std: float = 0.5, robot_translation_std_m: float = 0.0005,
                robot_rotation_std_rad: float = float(np.radians(0.05)), seed: int = 0,
                camera: CameraModel = DEFAULT_CAMERA, target: TargetSpec = DEFAULT_TARGET) -> SyntheticSet:
    """Static-camera views of a target held by the gripper."""
    rng = np.random.default_rng(seed)
    base_T_camera = look_at(np.array([1.1, 0.4, 0.6]), np.array([0.5, 0.0, 0.35]), 0.0)
    gripper_T_target = se3.from_rotvec(np.array([0.0, 0.0, 0.3]), np.array([-0.08, -0.14, 0.06]))
    points = target.object_points()
    out, truths = [], []
    while len(out) < views:
        # target centre somewhere in the camera's view, facing the camera within +-35 deg
        centre_camera = np.array([rng.uniform(-0.12, 0.12), rng.uniform(-0.08, 0.08), rng.uniform(0.5, 0.8)])
        # target z roughly along the optical axis (front facing the camera), tilted and rolled
        rotation = se3.from_rotvec(np.append(rng.uniform(-0.6, 0.6, 2), 0.0), np.zeros(3))[:3, :3] @ \
            se3.from_rotvec(np.array([0.0, 0.0, rng.uniform(-1.0, 1.0)]), np.zeros(3))[:3, :3]
        camera_T_target = se3.make(rotation, centre_camera - rotation @ points.mean(axis=0))
        base_T_gripper = base_T_camera @ camera_T_target @ se3.inv(gripper_T_target)
        detection = _observe(camera, camera_T_target, points, pixel_std, rng)
        if detection is None:
            continue
        noise = np.concatenate([rng.normal(0, robot_translation_std_m, 3), rng.normal(0, robot_rotation_std_rad, 3)])
        out.append(View(se3.twist(base_T_gripper, noise), detection, label=str(len(out))))
        truths.append(base_T_gripper)
    return SyntheticSet(out, camera, base_T_camera, gripper_T_target, truths)


def _observe(camera: CameraModel, camera_T_target: np.ndarray, points: np.ndarray, pixel_std: float,
             rng: np.random.Generator) -> Detection | None:
    in_camera = points @ camera_T_target[:3, :3].T + camera_T_target[:3, 3]
    if np.any(in_camera[:, 2] < 0.05):
        return None
    # the target's front must face the camera (its z axis points away from it)
    if camera_T_target[2, 2] <= 0.2:
        return None
    pixels = camera.project(in_camera)
    margin = 5
    inside = ((pixels[:, 0] > margin) & (pixels[:, 0] < camera.width - margin)
              & (pixels[:, 1] > margin) & (pixels[:, 1] < camera.height - margin))
    if not np.all(inside):
        return None
    noisy = pixels + rng.normal(0, pixel_std, pixels.shape)
    return Detection(np.arange(len(points)), points, noisy)
