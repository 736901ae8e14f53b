"""Calibration files (YAML) and the human-readable report. Pure Python (no rclpy)."""
from __future__ import annotations

import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from twinloop_calibration import se3
from twinloop_calibration.handeye import HandEyeResult, Setup
from twinloop_calibration.intrinsics import CameraModel
from twinloop_calibration.time_offset import TimeOffsetResult

FORMAT_VERSION = 1


def _floats(array) -> list:
    return np.asarray(array, dtype=float).round(12).tolist()


def calibration_document(result: HandEyeResult, *, camera_name: str, parent_frame: str, child_frame: str,
                         camera: CameraModel, source: dict[str, Any],
                         time_offset: TimeOffsetResult | None = None) -> dict[str, Any]:
    translation, quaternion = se3.to_xyz_quat(result.transform)
    std_t, std_r = result.std
    document: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "camera": camera_name,
        "setup": result.setup.value,
        "meaning": (f"{parent_frame}_T_camera: camera optical frame in the frame of the link it rides on"
                    if result.setup == Setup.EYE_IN_HAND else
                    f"{parent_frame}_T_camera: camera optical frame in the {parent_frame} frame"),
        "parent_frame": parent_frame,
        "child_frame": child_frame,
        "transform": {"translation_m": _floats(translation), "quaternion_xyzw": _floats(quaternion)},
        "covariance": {"order": "tx ty tz rx ry rz (m, rad; rotation vector; errors in the parent frame)",
                       "model": str(result.extra.get("covariance_model", "")),
                       "matrix_6x6": _floats(result.covariance)},
        "std_1sigma": {"translation_mm": round(float(std_t) * 1e3, 4), "rotation_deg": round(math.degrees(std_r), 5)},
        "target_transform": {"meaning": "base_T_target" if result.setup == Setup.EYE_IN_HAND else "gripper_T_target",
                             "translation_m": _floats(result.target_transform[:3, 3]),
                             "quaternion_xyzw": _floats(se3.to_xyz_quat(result.target_transform)[1])},
        "method": result.method,
        "reprojection_rms_px": round(float(result.reprojection_rms_px), 4),
        "held_out_rms_px": round(float(result.held_out_rms_px), 4),
        "held_out_rms_px_by_candidate": {k: round(float(v), 4) for k, v in result.held_out_rms_px_by_candidate.items()},
        "views_used": int(result.views_used),
        "views_rejected": [int(v) for v in result.rejected_views],
        "outliers": [{"view": o.label or str(o.index), "rms_px": round(float(o.rms_px), 4), "test": o.test,
                      "statistic": round(float(o.statistic), 3), "threshold": round(float(o.threshold), 3)}
                     for o in result.outliers],
        "noise_model": {"pixel_std_px": float(result.noise.pixel_std_px),
                        "robot_translation_std_mm": float(result.noise.robot_translation_std_m * 1e3),
                        "robot_rotation_std_deg": float(math.degrees(result.noise.robot_rotation_std_rad)),
                        "at_bound": bool(result.noise.at_bound)},
        "diversity": {"rotation_spread_deg": [float(v) for v in result.diversity.rotation_spread_deg],
                      "max_rotation_deg": float(result.diversity.max_rotation_deg)},
        "intrinsics": {"camera_matrix": _floats(camera.camera_matrix), "distortion": _floats(camera.distortion),
                       "width": int(camera.width), "height": int(camera.height),
                       "reprojection_rms_px": None if camera.reprojection_rms_px is None
                       else float(camera.reprojection_rms_px)},
        "source": source,
    }
    if result.scale_check is not None:
        check = result.scale_check
        document["target_scale"] = {"scale": round(float(check.scale), 6), "std": round(float(check.std), 6),
                                    "p_value": float(f"{check.p_value:.3g}"), "anomalous": bool(check.anomalous),
                                    "corrected": bool(check.applied)}
    if result.bootstrap_ratio is not None:
        document["bootstrap_std_ratio"] = {"translation": round(float(result.bootstrap_ratio[0]), 3),
                                           "rotation": round(float(result.bootstrap_ratio[1]), 3)}
    if time_offset is not None:
        document["time_offset"] = {"offset_s": float(time_offset.offset_s) if time_offset.observable else None,
                                   "std_s": float(time_offset.std_s) if time_offset.observable else None,
                                   "observable": bool(time_offset.observable), "reason": time_offset.reason}
    return document


def write_calibration(path: Path | str, document: dict[str, Any]) -> Path:
    """Write atomically (temp file + rename): a reader never sees half a calibration."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as stream:
            yaml.safe_dump(document, stream, sort_keys=False)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def load_calibration(path: Path | str) -> tuple[np.ndarray, dict[str, Any]]:
    """(parent_T_child 4x4, the whole document)."""
    document = yaml.safe_load(Path(path).read_text())
    transform = document["transform"]
    return se3.from_xyz_quat(transform["translation_m"], transform["quaternion_xyzw"]), document


class CalibrationFileError(ValueError):
    """A calibration file that cannot be used; the message says what is wrong in it."""


def read_camera_mount(path: Path | str, setup: str) -> tuple[str, np.ndarray]:
    """(the parent frame, parent_T_camera) of a calibration file that must be of `setup`
    (`eye_in_hand`: the parent is the link the camera rides on; `eye_to_hand`: the robot's
    base). The one reader of the file for the stages that use a camera's pose."""
    path = Path(path)
    try:
        document = yaml.safe_load(path.read_text())
        if not isinstance(document, dict):
            raise TypeError("empty, or not a mapping of keys")
        transform, parent, found = document["transform"], str(document["parent_frame"]), document["setup"]
        translation = np.array(transform["translation_m"], dtype=float)
        quaternion = np.array(transform["quaternion_xyzw"], dtype=float)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as error:
        why = (f"no key {error}" if isinstance(error, KeyError) else
               str(error).strip().splitlines()[0] if isinstance(error, yaml.YAMLError) and str(error).strip() else
               str(error))  # a YAML error spans several lines: its first says what
        raise CalibrationFileError(f"{path}: not a readable calibration file ({why}); write one with "
                                   "`twinloop calibrate`") from error
    if found != setup:
        raise CalibrationFileError(f"{path}: a {found} calibration; this camera needs an {setup} one")
    if translation.shape != (3,) or quaternion.shape != (4,) or not np.all(np.isfinite(np.r_[translation, quaternion])) \
            or not math.isclose(float(np.linalg.norm(quaternion)), 1.0, abs_tol=1e-3):
        raise CalibrationFileError(f"{path}: transform must be a finite translation_m (3) and a unit "
                                   "quaternion_xyzw (4)")
    return parent, se3.from_xyz_quat(translation, quaternion)


def from_described_mount(camera: str, parent: str, parent_T_camera: np.ndarray, workcell=None,
                         kinematics=None) -> tuple[float, float] | None:
    """(translation m, rotation rad) of a calibrated camera pose `parent_T_camera` from the
    mount the workcell description gives the camera's optical frame, in the same parent
    frame; None where the description has no such camera or frame. `workcell` and
    `kinematics` (twinloop_twin's) are loaded when not given."""
    from twinloop_twin.kinematics import UrdfTransforms
    from twinloop_twin.workcell import load_workcell

    workcell = workcell or load_workcell()
    kinematics = kinematics or UrdfTransforms(workcell.urdf_xml)
    home = workcell.home_joint_positions
    try:
        frame = workcell.cameras[camera].color_optical_frame
        mount = se3.inv(kinematics.world_T_link(parent, home)) @ kinematics.world_T_link(frame, home)
    except KeyError:
        return None
    return se3.errors(parent_T_camera, mount)


def report(result: HandEyeResult, *, title: str = "hand-eye calibration",
           time_offset: TimeOffsetResult | None = None, target_spacing_m: float | None = None) -> str:
    """The result for a person; `target_spacing_m` (the target's square or dot spacing) puts
    the scale check in millimetres."""
    translation, quaternion = se3.to_xyz_quat(result.transform)
    std_t, std_r = result.std
    what = "gripper_T_camera" if result.setup == Setup.EYE_IN_HAND else "base_T_camera"
    lines = [
        f"{title} ({result.setup.value}), method: {result.method}",
        f"  {what}: xyz [{', '.join(f'{v:.5f}' for v in translation)}] m, "
        f"quaternion xyzw [{', '.join(f'{v:.5f}' for v in quaternion)}]",
        f"  1-sigma: {std_t * 1e3:.3f} mm, {math.degrees(std_r):.4f} deg "
        f"(covariance: {result.extra.get('covariance_model', '?')})",
        f"  reprojection RMS {result.reprojection_rms_px:.3f} px; held-out RMS {result.held_out_rms_px:.3f} px",
        "  held-out by candidate: " + ", ".join(f"{k} {v:.3f} px" for k, v in result.held_out_rms_px_by_candidate.items()),
        f"  views used {result.views_used}, rejected {len(result.outliers)}"
        + "".join(f"\n    rejected {o.describe()}" for o in result.outliers),
        f"  noise model: {result.noise.describe()}",
        f"  view diversity: {result.diversity.describe()}",
    ]
    if result.scale_check is not None:
        lines.append(("  WARNING: " if result.scale_check.anomalous else "  ")
                     + result.scale_check.describe(target_spacing_m))
    if result.bootstrap_ratio is not None:
        lines.append(f"  reported / bootstrap spread: translation {result.bootstrap_ratio[0]:.2f}, rotation "
                     f"{result.bootstrap_ratio[1]:.2f} (the reported covariance's size, the root of its trace, over "
                     "that of the views resampled and calibrated again; near 1: the reported uncertainty matches the "
                     "scatter)")
    if time_offset is not None:
        lines.append(f"  time offset: {time_offset.offset_s * 1e3:.2f} +- {time_offset.std_s * 1e3:.2f} ms"
                     if time_offset.observable else f"  time offset: not estimated ({time_offset.reason})")
    if result.opencv:
        lines.append("  OpenCV's methods (the starting estimates; the best of them is scored on held-out views "
                     "above), each one's distance from this result:")
    for name, x in result.opencv.items():
        t, r = se3.errors(x, result.transform)
        lines.append(f"    {name}: {t * 1e3:.2f} mm, {math.degrees(r):.3f} deg")
    return "\n".join(lines)
