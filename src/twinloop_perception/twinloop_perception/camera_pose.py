"""Where a camera is in `world`: its URDF mount, or an eye-to-hand calibration of it."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import yaml
from scipy.spatial.transform import Rotation

from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.workcell import WorkcellDescription


class CameraPoseError(ValueError):
    """The camera's pose cannot be had; the message says from what and what to do."""


def world_T_camera(workcell: WorkcellDescription, camera: str, calibration_file: Path | str | None = None) -> np.ndarray:
    """The camera's color optical frame in `world` (a static camera: no joint moves it).

    A calibration file (twinloop calibrate, eye-to-hand) gives base_T_camera; its parent
    frame is placed in `world` by the URDF.
    """
    intrinsics = workcell.cameras[camera]
    kinematics = UrdfTransforms(workcell.urdf_xml)
    if calibration_file is None:
        return kinematics.world_T_link(intrinsics.color_optical_frame, {})
    path = Path(calibration_file)
    try:
        document = yaml.safe_load(path.read_text())
        transform = document["transform"]
        parent = document["parent_frame"]
        setup = document["setup"]
        translation = np.array(transform["translation_m"], dtype=float)
        quaternion = np.array(transform["quaternion_xyzw"], dtype=float)
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as error:
        raise CameraPoseError(f"{path}: not a readable calibration file ({error}); write one with "
                              "`twinloop calibrate`, or leave calibration_file empty for the URDF mount") from error
    if setup != "eye_to_hand":
        raise CameraPoseError(f"{path}: a {setup} calibration; a static camera needs an eye_to_hand one")
    if translation.shape != (3,) or quaternion.shape != (4,) or not np.all(np.isfinite(np.r_[translation, quaternion])) \
            or not math.isclose(float(np.linalg.norm(quaternion)), 1.0, abs_tol=1e-3):
        raise CameraPoseError(f"{path}: transform must be a finite translation_m (3) and a unit quaternion_xyzw (4)")
    try:
        world_T_parent = kinematics.world_T_link(parent, {})
    except KeyError:
        raise CameraPoseError(f"{path}: parent frame '{parent}' is not a link of the workcell URDF") from None
    parent_T_camera = np.eye(4)
    parent_T_camera[:3, :3] = Rotation.from_quat(quaternion).as_matrix()
    parent_T_camera[:3, 3] = translation
    return world_T_parent @ parent_T_camera
