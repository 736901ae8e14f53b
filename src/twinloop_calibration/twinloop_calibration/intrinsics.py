"""Camera intrinsics: from camera_info, or calibrated from the same target views.

Pure Python (no rclpy). The calibration itself is cv2.calibrateCamera; this module adds
the checks and the per-view reprojection RMS a user needs to trust it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import cv2
import numpy as np

from twinloop_calibration.targets import Detection


class IntrinsicsError(ValueError):
    """Intrinsics cannot be calibrated or are malformed; the message says what to do."""


@dataclass(frozen=True)
class CameraModel:
    """Pinhole + plumb_bob distortion (OpenCV's k1 k2 p1 p2 k3)."""

    camera_matrix: np.ndarray  # 3x3
    distortion: np.ndarray = field(default_factory=lambda: np.zeros(5))
    width: int = 0  # px
    height: int = 0  # px
    reprojection_rms_px: float | None = None  # set when calibrated here
    per_view_rms_px: tuple[float, ...] = ()
    # when calibrated here: std of fx, fy, cx, cy, k1, k2, p1, p2, k3 (cv2.calibrateCameraExtended)
    intrinsics_std: tuple[float, ...] = ()

    def project(self, points_camera: np.ndarray) -> np.ndarray:
        """Project N x 3 points given in the camera's optical frame to N x 2 pixels."""
        if not np.any(self.distortion):
            # Plain pinhole in numpy: the solver calls this thousands of times per solve.
            k = self.camera_matrix
            z = points_camera[:, 2]
            return np.column_stack([k[0, 0] * points_camera[:, 0] / z + k[0, 2],
                                    k[1, 1] * points_camera[:, 1] / z + k[1, 2]])
        pixels, _ = cv2.projectPoints(points_camera.reshape(-1, 1, 3), np.zeros(3), np.zeros(3),
                                      self.camera_matrix, self.distortion)
        return pixels.reshape(-1, 2)


def from_camera_info(k: Sequence[float], d: Sequence[float], width: int, height: int) -> CameraModel:
    """CameraModel of a sensor_msgs/CameraInfo (plumb_bob or no distortion)."""
    matrix = np.asarray(k, dtype=float).reshape(3, 3)
    if matrix[0, 0] <= 0 or matrix[1, 1] <= 0:
        raise IntrinsicsError(f"camera_info has no focal length (K = {list(k)}): the camera driver "
                              "publishes an uncalibrated camera; set intrinsics_source to 'calibrate'")
    distortion = np.zeros(5)
    distortion[:min(5, len(d))] = np.asarray(d, dtype=float)[:5]
    return CameraModel(matrix, distortion, int(width), int(height))


def calibrate_intrinsics(detections: Sequence[Detection], image_size: tuple[int, int], *,
                         min_views: int = 8, fix_k3: bool = True) -> CameraModel:
    """cv2.calibrateCamera over the target views; image_size = (width, height)."""
    views = [d for d in detections if len(d) >= 6]
    if len(views) < min_views:
        raise IntrinsicsError(f"intrinsics need at least {min_views} views with the target found, got "
                              f"{len(views)}; collect more views (or use camera_info)")
    flags = cv2.CALIB_FIX_K3 if fix_k3 else 0
    rms, matrix, distortion, rvecs, tvecs, intrinsics_std, _, _ = cv2.calibrateCameraExtended(
        [d.object_points.astype(np.float32) for d in views], [d.image_points.astype(np.float32) for d in views],
        image_size, None, None, flags=flags)
    per_view = []
    for detection, rvec, tvec in zip(views, rvecs, tvecs):
        projected, _ = cv2.projectPoints(detection.object_points, rvec, tvec, matrix, distortion)
        per_view.append(float(np.sqrt(np.mean(np.sum((projected.reshape(-1, 2) - detection.image_points) ** 2,
                                                     axis=1)))))
    return CameraModel(matrix, distortion.ravel()[:5], image_size[0], image_size[1], float(rms), tuple(per_view),
                       tuple(float(v) for v in np.asarray(intrinsics_std).ravel()[:9]))


def solve_pnp(detection: Detection, camera: CameraModel) -> np.ndarray:
    """camera_T_target of one view (4x4), by cv2.solvePnP (iterative, from IPPE for planar targets)."""
    ok, rvec, tvec = cv2.solvePnP(detection.object_points, detection.image_points, camera.camera_matrix,
                                  camera.distortion, flags=cv2.SOLVEPNP_IPPE)
    if ok:
        ok, rvec, tvec = cv2.solvePnP(detection.object_points, detection.image_points, camera.camera_matrix,
                                      camera.distortion, rvec, tvec, useExtrinsicGuess=True,
                                      flags=cv2.SOLVEPNP_ITERATIVE)
    if not ok:
        raise IntrinsicsError("solvePnP failed on a view; the detection is inconsistent with the target")
    out = np.eye(4)
    out[:3, :3] = cv2.Rodrigues(rvec)[0]
    out[:3, 3] = tvec.ravel()
    return out
