"""UrdfTransforms (robot_state_publisher's job, with pinocchio) against known truth.

Truth is twofold: the URDF joint origins and axes themselves, and MuJoCo's forward
kinematics of the same composed URDF (the scene the simulator runs).
"""
from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # must precede `import mujoco`

import xml.etree.ElementTree as ET  # noqa: E402

import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy.spatial.transform import Rotation  # noqa: E402

from twinloop_twin.kinematics import UrdfTransforms, matrix_to_quaternion_xyzw  # noqa: E402
from twinloop_twin.physics import ALL_JOINTS, load_physics  # noqa: E402
from twinloop_twin.scene import compile_workcell, joint_qpos_addresses  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402

TOLERANCE = 1e-6  # m and rotation-matrix entries


@pytest.fixture(scope="module")
def workcell():
    return load_workcell()


@pytest.fixture(scope="module")
def transforms(workcell):
    return UrdfTransforms(workcell.urdf_xml)


@pytest.fixture(scope="module")
def scene(workcell):
    return compile_workcell(workcell, load_physics(default_config_dir() / "nominal_physics.yaml"))


@pytest.fixture(scope="module")
def urdf_joints(workcell):
    return {joint.get("name"): joint for joint in ET.fromstring(workcell.urdf_xml).findall("joint")}


def _origin_T(joint: ET.Element) -> np.ndarray:
    """The URDF <origin> of a joint as a 4x4 transform (rpy: fixed-axis x, then y, then z)."""
    origin = joint.find("origin")
    xyz = [float(v) for v in (origin.get("xyz", "0 0 0") if origin is not None else "0 0 0").split()]
    rpy = [float(v) for v in (origin.get("rpy", "0 0 0") if origin is not None else "0 0 0").split()]
    transform = np.eye(4)
    transform[:3, :3] = Rotation.from_euler("xyz", rpy).as_matrix()
    transform[:3, 3] = xyz
    return transform


def _motion_T(joint: ET.Element, position: float) -> np.ndarray:
    axis = np.array([float(v) for v in joint.find("axis").get("xyz").split()])
    axis /= np.linalg.norm(axis)
    transform = np.eye(4)
    if joint.get("type") == "prismatic":
        transform[:3, 3] = axis * position
    else:
        transform[:3, :3] = Rotation.from_rotvec(axis * position).as_matrix()
    return transform


def _random_configurations(urdf_joints, count: int, seed: int) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    configurations = []
    for _ in range(count):
        configuration = {}
        for name in ALL_JOINTS:
            limit = urdf_joints[name].find("limit")
            configuration[name] = float(rng.uniform(float(limit.get("lower")), float(limit.get("upper"))))
        configurations.append(configuration)
    return configurations


@pytest.mark.parametrize("link", ["panda_hand", "static_camera_color_optical_frame",
                                  "wrist_camera_color_optical_frame", "panda_leftfinger"])
def test_world_T_link_matches_mujoco_body_poses_at_random_configurations(scene, transforms, urdf_joints, link):
    model = scene
    data = mujoco.MjData(model)
    addresses = joint_qpos_addresses(model, ALL_JOINTS)
    body = model.body(link).id
    previous = None
    for configuration in _random_configurations(urdf_joints, 3, seed=2024):
        mujoco.mj_resetData(model, data)
        data.qpos[addresses] = [configuration[name] for name in ALL_JOINTS]
        mujoco.mj_kinematics(model, data)
        world_T_link = transforms.world_T_link(link, configuration)
        np.testing.assert_allclose(world_T_link[:3, 3], data.xpos[body], rtol=0, atol=TOLERANCE)
        np.testing.assert_allclose(world_T_link[:3, :3], data.xmat[body].reshape(3, 3), rtol=0, atol=TOLERANCE)
        np.testing.assert_allclose(world_T_link[3], [0, 0, 0, 1], rtol=0, atol=0)
        if previous is not None and link != "static_camera_color_optical_frame":
            assert np.abs(world_T_link - previous).max() > 1e-2  # the configurations really differ here
        previous = world_T_link


def test_static_camera_does_not_move_with_the_arm(transforms, workcell):
    home = transforms.world_T_link("static_camera_color_optical_frame", workcell.home_joint_positions)
    moved = transforms.world_T_link("static_camera_color_optical_frame", {"panda_joint1": 1.0, "panda_joint2": 0.5})
    np.testing.assert_allclose(moved, home, rtol=0, atol=1e-12)


def test_static_transforms_are_exactly_the_fixed_joints_at_their_urdf_origins(transforms, urdf_joints):
    fixed = {(j.find("parent").get("link"), j.find("child").get("link")): j
             for j in urdf_joints.values() if j.get("type") == "fixed"}
    moving_children = {j.find("child").get("link") for j in urdf_joints.values() if j.get("type") != "fixed"}
    published = {(t.parent, t.child): t.parent_T_child for t in transforms.static_transforms}
    assert len(transforms.static_transforms) == len(published)  # no duplicates
    assert set(published) == set(fixed)
    assert not moving_children & {child for _, child in published}  # no moving (or floating) joint
    assert ("world", "panda_link0") in published
    assert ("static_camera_link", "static_camera_color_optical_frame") in published
    for key, joint in fixed.items():
        np.testing.assert_allclose(published[key], _origin_T(joint), rtol=0, atol=1e-12, err_msg=str(key))


def test_moving_transforms_have_one_entry_per_moving_joint_at_origin_times_motion(transforms, urdf_joints):
    moving = [j for j in urdf_joints.values() if j.get("type") in ("revolute", "continuous", "prismatic")]
    assert len(moving) == len(ALL_JOINTS)  # 7 revolute + 2 prismatic; the box's floating joint is not one
    positions = {name: 0.1 * (index + 1) if name.startswith("panda_joint") else 0.013
                 for index, name in enumerate(ALL_JOINTS)}
    published = transforms.moving_transforms(positions)
    assert len(published) == len(moving)
    by_child = {t.child: t for t in published}
    assert len(by_child) == len(moving)
    for joint in moving:
        child = joint.find("child").get("link")
        entry = by_child[child]
        assert entry.parent == joint.find("parent").get("link")
        expected = _origin_T(joint) @ _motion_T(joint, positions[joint.get("name")])
        np.testing.assert_allclose(entry.parent_T_child, expected, rtol=0, atol=1e-12, err_msg=joint.get("name"))


def test_joints_left_out_of_a_partial_update_are_at_zero(transforms, urdf_joints):
    entry = {t.child: t for t in transforms.moving_transforms({"panda_joint2": 0.4})}["panda_link1"]
    np.testing.assert_allclose(entry.parent_T_child, _origin_T(urdf_joints["panda_joint1"]), rtol=0, atol=1e-12)


@pytest.mark.parametrize("rotation", [
    Rotation.from_euler("x", 60, degrees=True),
    Rotation.from_euler("z", 90, degrees=True),
    Rotation.from_euler("y", 179, degrees=True),
    *Rotation.random(20, random_state=7),
])
def test_matrix_to_quaternion_xyzw_round_trips_with_scipy(rotation):
    q = np.array(matrix_to_quaternion_xyzw(rotation.as_matrix()))
    assert np.linalg.norm(q) == pytest.approx(1.0, abs=1e-12)
    expected = rotation.as_quat()  # scipy is (x, y, z, w), as ROS
    # q and -q are the same rotation; compare up to that sign only
    assert np.allclose(q, expected, atol=1e-9) or np.allclose(q, -expected, atol=1e-9), (q, expected)
    np.testing.assert_allclose(Rotation.from_quat(q).as_matrix(), rotation.as_matrix(), rtol=0, atol=1e-9)


def test_matrix_to_quaternion_xyzw_puts_w_last():
    # 60 degrees about x: (sin 30°, 0, 0, cos 30°); a (w, x, y, z) order would read (0.866, 0.5, 0, 0)
    q = matrix_to_quaternion_xyzw(Rotation.from_euler("x", 60, degrees=True).as_matrix())
    np.testing.assert_allclose(np.abs(q), [0.5, 0.0, 0.0, np.sqrt(3) / 2], atol=1e-12)
    assert np.sign(q[0]) == np.sign(q[3])
    np.testing.assert_allclose(matrix_to_quaternion_xyzw(np.eye(3)), [0, 0, 0, 1], atol=1e-15)
