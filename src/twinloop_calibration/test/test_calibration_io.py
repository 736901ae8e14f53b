"""The calibration file as the stages that use a camera's pose read it (read_camera_mount)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from twinloop_calibration.calibration_io import CalibrationFileError, read_camera_mount


def _write(path, setup="eye_in_hand", translation=(0.05, -0.01, 0.04), quaternion=None):
    quaternion = Rotation.from_euler("xyz", [0.1, -0.2, 1.5]).as_quat().tolist() if quaternion is None else quaternion
    path.write_text(f"setup: {setup}\nparent_frame: panda_hand\ntransform:\n  translation_m: {[float(v) for v in translation]}\n"
                    f"  quaternion_xyzw: {list(quaternion)}\n")
    return path


def test_a_calibration_gives_its_parent_frame_and_transform(tmp_path):
    parent, transform = read_camera_mount(_write(tmp_path / "wrist.yaml"), "eye_in_hand")
    assert parent == "panda_hand"
    np.testing.assert_allclose(transform[:3, 3], [0.05, -0.01, 0.04])
    np.testing.assert_allclose(transform[:3, :3], Rotation.from_euler("xyz", [0.1, -0.2, 1.5]).as_matrix(), atol=1e-12)


@pytest.mark.parametrize("write, expected", [
    (lambda p: _write(p, setup="eye_to_hand"), "a eye_to_hand calibration; this camera needs an eye_in_hand one"),
    (lambda p: _write(p, quaternion=[0, 0, 0, 2]), "unit quaternion_xyzw"),
    (lambda p: _write(p, translation=(0.0, float("nan"), 0.0)), "finite translation_m"),
    (lambda p: p.write_text("transform: [1, 2]\n") and p, "not a readable calibration file"),
    (lambda p: p, "not a readable calibration file"),  # no file
    (lambda p: p.write_text("a: 1\n") and p, r"not a readable calibration file \(no key 'transform'\)"),
    (lambda p: (p.write_text(""), p)[1], r"\(empty, or not a mapping of keys\)"),
    (lambda p: p.write_text("a: [1\n") and p, r"\(while parsing a flow sequence\); write one"),  # one line
])
def test_a_file_that_cannot_be_used_is_refused_saying_why(tmp_path, write, expected):
    path = write(tmp_path / "calibration.yaml")
    with pytest.raises(CalibrationFileError, match=expected) as refused:
        read_camera_mount(path, "eye_in_hand")
    assert "\n" not in str(refused.value)
