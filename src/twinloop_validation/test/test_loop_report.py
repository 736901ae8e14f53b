"""The run page's calibration section read from calibration files: the calibrated pose
against the camera's mount in the workcell description, for a file offset from the mount
by a known amount, and one line for a file that is not a calibration.
(The whole page is checked against a real run's artefacts in test/test_loop.py.)"""
from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from twinloop_calibration import se3
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.workcell import load_workcell
from twinloop_validation.loop_report import _calibrations

OFFSET_MM, OFFSET_DEG = 2.0, 0.3


def _calibration_file(path, base_T_camera: np.ndarray) -> None:
    translation, quaternion = se3.to_xyz_quat(base_T_camera)
    path.write_text(yaml.safe_dump({
        "camera": "static_camera", "setup": "eye_to_hand", "parent_frame": "panda_link0",
        "transform": {"translation_m": translation.tolist(), "quaternion_xyzw": quaternion.tolist()},
        "std_1sigma": {"translation_mm": 1.1, "rotation_deg": 0.07}, "reprojection_rms_px": 0.13,
        "held_out_rms_px": 0.11, "views_used": 12}))


def test_offset_from_the_urdf_mount_and_a_file_that_is_not_a_calibration(tmp_path):
    workcell = load_workcell()
    kinematics = UrdfTransforms(workcell.urdf_xml)
    mount = np.linalg.inv(kinematics.world_T_link("panda_link0", {})) @ kinematics.world_T_link(
        workcell.cameras["static_camera"].color_optical_frame, {})
    axis = np.array([1.0, 2.0, -1.0]) / math.sqrt(6.0)
    offset = se3.from_rotvec(axis * math.radians(OFFSET_DEG), np.array([0.0, 0.6, 0.8]) * OFFSET_MM * 1e-3)
    _calibration_file(tmp_path / "static_camera.yaml", mount @ offset)
    (tmp_path / "notes.yaml").write_text("views: 3\n")

    notes, static = _calibrations(tmp_path)
    assert notes["file"] == "notes.yaml" and "not a calibration file" in notes["error"]
    assert static["camera"] == "static_camera" and static["views_used"] == 12 and static["held_out_rms_px"] == 0.11
    assert static["from_urdf_mount"]["translation_mm"] == pytest.approx(OFFSET_MM, abs=1e-3)
    assert static["from_urdf_mount"]["rotation_deg"] == pytest.approx(OFFSET_DEG, abs=1e-4)
    assert _calibrations(tmp_path / "nothing") == []
