"""The scanned box's orientation in the geometry layer: a scan sees the box's faces, not which
of its edges is its x, so of the quarter turns about the table's normal whose edges match the
described size the layer takes the one nearest the described orientation (a cube: within
45 degrees of it; a 10 x 6 cm box: the long edge along the described x)."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from twinloop_builder.geometry.assembly import geometry_layer
from twinloop_builder.geometry.objects import Segmentation, TableObject
from twinloop_twin.nominal import build_nominal_twin, load_scene

TABLE_M = 0.75


@pytest.fixture(scope="module")
def parent_model(tmp_path_factory):
    return load_scene(build_nominal_twin(tmp_path_factory.mktemp("twins"), "emulated"))


def _scanned_box(yaw_deg: float, size_m) -> Segmentation:
    pose = np.eye(4)
    pose[:3, :3] = Rotation.from_euler("z", yaw_deg, degrees=True).as_matrix()
    pose[:3, 3] = [0.45, -0.20, TABLE_M + size_m[2] / 2]
    box = TableObject(pose, np.array(size_m, float), np.zeros((500, 3)))
    return Segmentation(np.array([0.0, 0.0, 1.0, -TABLE_M]), np.zeros((0, 3)), [box], 0)


def _yaw_deg(quat_wxyz) -> float:
    w, x, y, z = quat_wxyz
    return float(Rotation.from_quat([x, y, z, w]).as_euler("xyz", degrees=True)[2])


@pytest.mark.parametrize("size_m, scanned_yaw_deg, described_yaw_deg, expected_yaw_deg", [
    ((0.061, 0.058, 0.0595), -89.6, 0.0, 0.4),  # a cube seen a quarter turn round: taken as described
    ((0.061, 0.058, 0.0595), 181.0, 0.0, 1.0),
    ((0.061, 0.058, 0.0595), -55.0, 30.0, 35.0),
    ((0.06, 0.10, 0.04), 97.0, 0.0, 7.0),  # the scan's x along the long edge: turned to the described x
    ((0.06, 0.10, 0.04), -83.0, 0.0, 7.0),
    ((0.10, 0.06, 0.04), 175.0, 0.0, -5.0),  # a half turn is the only other match of a 10 x 6 cm box
])
def test_the_box_takes_the_symmetric_orientation_nearest_the_description(parent_model, size_m, scanned_yaw_deg,
                                                                        described_yaw_deg, expected_yaw_deg):
    described = Rotation.from_euler("z", described_yaw_deg, degrees=True).as_quat()
    box_size = (0.06, 0.06, 0.06) if size_m[0] < 0.07 and size_m[1] < 0.07 else (0.10, 0.06, 0.04)
    layer, _ = geometry_layer(_scanned_box(scanned_yaw_deg, size_m), parent_model, box_size, TABLE_M,
                              box_quat_wxyz=(described[3], *described[:3]))
    assert _yaw_deg(layer.box_quat_wxyz) == pytest.approx(expected_yaw_deg, abs=1e-6)
    assert layer.box_position_m[:2] == pytest.approx((0.45, -0.20), abs=1e-9)
