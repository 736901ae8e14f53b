"""Where a camera is in `world`: its URDF mount, or an eye-to-hand calibration of it."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from twinloop_calibration.calibration_io import CalibrationFileError, read_camera_mount
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
    try:
        parent, parent_T_camera = read_camera_mount(calibration_file, "eye_to_hand")
    except CalibrationFileError as error:
        raise CameraPoseError(f"{error}; or leave calibration_file empty for the URDF mount") from error
    try:
        world_T_parent = kinematics.world_T_link(parent, {})
    except KeyError:
        raise CameraPoseError(f"{calibration_file}: parent frame '{parent}' is not a link of the workcell URDF") from None
    return world_T_parent @ parent_T_camera
