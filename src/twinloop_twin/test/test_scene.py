"""The workcell description and its MuJoCo scene, checked against known truth.

Every config file and the URDF are loaded here; every compiled scene must simulate without
a single MuJoCo warning (as mujoco_menagerie's model tests demand).
"""

from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede `import mujoco`

import xml.etree.ElementTree as ET  # noqa: E402
from pathlib import Path  # noqa: E402

import cv2  # noqa: E402
import mujoco  # noqa: E402
import numpy as np  # noqa: E402
import pinocchio  # noqa: E402
import pytest  # noqa: E402

from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS, COMMANDED_JOINTS, load_physics  # noqa: E402
from twinloop_twin.scene import (  # noqa: E402
    COMMAND_JOINT_TO_ACTUATOR,
    TIMESTEP_S,
    actuator_ids,
    command_actuator_ids,
    command_delay_of,
    compile_workcell,
    joint_dof_addresses,
    joint_qpos_addresses,
    make_charuco_board,
    mujoco_actuator_delay,
    reset_to_home,
)
from twinloop_twin.workcell import (  # noqa: E402
    EXAMPLE_ROBOT_DATA_ENV,
    ExampleRobotDataMissing,
    WorkcellConfigError,
    default_config_dir,
    default_urdf_path,
    find_example_robot_data,
    load_workcell,
    resolve_package_uri,
)

PHYSICS_FILES = ("nominal_physics.yaml", "emulated_truth.yaml", "emulated_truth_slow.yaml")
# optical frame (z forward, y down) -> MuJoCo camera frame (-z forward, y up)
MUJOCO_CAMERA_T_OPTICAL = np.diag([1.0, -1.0, -1.0])


@pytest.fixture(scope="module")
def workcell():
    return load_workcell(default_config_dir(), default_urdf_path())


@pytest.fixture(scope="module", params=PHYSICS_FILES)
def physics(request):
    return load_physics(default_config_dir() / request.param)


def _home_data(model):
    data = mujoco.MjData(model)
    reset_to_home(model, data)
    return data


def _pinocchio_at_home(workcell):
    model = pinocchio.buildModelFromXML(workcell.urdf_xml)
    data = model.createData()
    q = pinocchio.neutral(model)
    for name, value in workcell.home_joint_positions.items():
        q[model.joints[model.getJointId(name)].idx_q] = value
    pinocchio.framesForwardKinematics(model, data, q)
    return model, data


def _world_T_frame(pin_model, pin_data, frame):
    return pin_data.oMf[pin_model.getFrameId(frame)]


# --------------------------------------------------------------------------- description

def test_composed_urdf_is_one_tree_with_the_panda_joints(workcell):
    root = ET.fromstring(workcell.urdf_xml)
    joints = {joint.get("name"): joint.get("type") for joint in root.findall("joint")}
    for name in ALL_JOINTS:
        assert name in joints
    assert joints["world_to_panda_link0"] == "fixed" and joints["box_joint"] == "floating"
    # published on /robot_description: the ROS package URIs stay
    assert all(m.get("filename").startswith("package://example-robot-data/") for m in root.iter("mesh"))
    for link in ("wrist_camera_color_optical_frame", "wrist_camera_depth_optical_frame",
                 "static_camera_color_optical_frame", "static_camera_depth_optical_frame", "charuco_board"):
        assert root.find(f"link[@name='{link}']") is not None


def test_pinocchio_builds_the_composed_urdf(workcell):
    model = pinocchio.buildModelFromXML(workcell.urdf_xml)
    names = list(model.names)[1:]  # drop "universe"
    assert [n for n in names if n.startswith("panda_")] == list(ALL_JOINTS)
    assert names == ["box_joint", *ALL_JOINTS]  # the floating box is pinocchio's free flyer
    assert model.nq == 9 + 7


def test_mesh_uris_resolve_to_installed_files(workcell):
    for mesh in ET.fromstring(workcell.urdf_xml).iter("mesh"):
        path = resolve_package_uri(mesh.get("filename"))
        assert path.is_file(), path
        assert str(find_example_robot_data()) in str(path)  # referenced from the install, never copied


def test_missing_example_robot_data_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv(EXAMPLE_ROBOT_DATA_ENV, str(tmp_path))
    with pytest.raises(ExampleRobotDataMissing) as error:
        find_example_robot_data()
    message = str(error.value)
    assert str(tmp_path) in message and "pip install example-robot-data" in message
    assert EXAMPLE_ROBOT_DATA_ENV in message
    with pytest.raises(FileNotFoundError):  # it is a FileNotFoundError for generic handlers
        load_workcell(default_config_dir(), default_urdf_path())


def test_share_env_locates_installed_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("TWINLOOP_SHARE", str(tmp_path))
    assert default_config_dir() == tmp_path / "config"
    assert default_urdf_path() == tmp_path / "urdf" / "workcell.urdf"


def test_workcell_yaml_contents(workcell):
    assert set(workcell.cameras) == {"wrist_camera", "static_camera"}
    for camera in workcell.cameras.values():
        assert (camera.width, camera.height, camera.rate_hz) == (640, 480, 30.0)
    assert set(workcell.home_joint_positions) == set(ALL_JOINTS)
    assert workcell.table_top_height_m == pytest.approx(0.75)


def test_yaml_that_disagrees_with_the_urdf_is_rejected(tmp_path):
    text = (default_config_dir() / "workcell.yaml").read_text()
    (tmp_path / "workcell.yaml").write_text(text.replace("top_height_m: 0.75", "top_height_m: 0.80"))
    with pytest.raises(WorkcellConfigError, match="table.top_height_m"):
        load_workcell(tmp_path, default_urdf_path())


def test_yaml_with_an_unknown_key_is_rejected(tmp_path):
    text = (default_config_dir() / "workcell.yaml").read_text()
    (tmp_path / "workcell.yaml").write_text(text.replace("    rate_hz: 30.0", "    rate: 30.0", 1))
    with pytest.raises(WorkcellConfigError, match="cameras.wrist_camera.rate"):
        load_workcell(tmp_path, default_urdf_path())


# --------------------------------------------------------------------------- the scene

def test_scene_simulates_2s_without_warnings_and_holds_home(workcell, physics):
    model = compile_workcell(workcell, physics)
    assert model.opt.timestep == TIMESTEP_S
    data = _home_data(model)
    arm = joint_qpos_addresses(model, ARM_JOINTS)
    home = np.array(workcell.home_arm_positions)
    worst = 0.0
    for _ in range(round(2.0 / model.opt.timestep)):
        mujoco.mj_step(model, data)
        worst = max(worst, np.abs(data.qpos[arm] - home).max())
    warnings = {mujoco.mjtWarning(i).name: data.warning[i].number for i in range(len(data.warning))
                if data.warning[i].number}
    assert warnings == {}
    assert worst < 2e-3, f"arm drifted {worst * 1e3:.3f} mrad from home under {physics.source}"
    box = model.body(workcell.box.link).id  # resting on the table, not fallen through
    assert data.xpos[box][2] == pytest.approx(workcell.table_top_height_m + workcell.box.size_m[2] / 2, abs=2e-3)


def test_compiled_parameters_equal_the_physics_file(workcell, physics):
    model = compile_workcell(workcell, physics)
    assert model.body_mass[model.body("box").id] == pytest.approx(physics.box.mass_kg)
    dofs = joint_dof_addresses(model, ALL_JOINTS)
    for dof, name in zip(dofs, ALL_JOINTS):
        joint = physics.joints[name]
        assert model.dof_frictionloss[dof] == pytest.approx(joint.friction_loss)
        assert model.dof_damping[dof] == pytest.approx(joint.damping)
        assert model.dof_armature[dof] == pytest.approx(joint.armature)
    for actuator, name in zip(command_actuator_ids(model, COMMANDED_JOINTS), COMMANDED_JOINTS):
        assert model.actuator_gainprm[actuator, 0] == pytest.approx(physics.joints[name].kp)
        assert model.actuator_biasprm[actuator, 1] == pytest.approx(-physics.joints[name].kp)
        assert model.actuator_biasprm[actuator, 2] == pytest.approx(-physics.joints[name].kv)
        assert command_delay_of(model.actuator_delay[actuator]) == pytest.approx(physics.command_delay_s)
        assert model.actuator_history[actuator, 0] * model.opt.timestep >= physics.command_delay_s
    box_geoms = [g for g in range(model.ngeom) if model.geom_bodyid[g] == model.body("box").id
                 and model.geom_contype[g]]
    assert [model.geom_friction[g, 0] for g in box_geoms] == [pytest.approx(physics.box.friction)]


def test_command_mapping_names_real_actuators():
    model = compile_workcell(load_workcell(), load_physics(default_config_dir() / "nominal_physics.yaml"))
    assert list(COMMAND_JOINT_TO_ACTUATOR) == list(COMMANDED_JOINTS) == [*ARM_JOINTS, "panda_finger_joint1"]
    ids = actuator_ids(model, list(COMMAND_JOINT_TO_ACTUATOR.values()))
    joints = [model.joint(model.actuator_trnid[i, 0]).name for i in ids]
    assert joints == list(COMMANDED_JOINTS)
    with pytest.raises(KeyError):
        command_actuator_ids(model, ["panda_finger_joint2"])  # the mimic finger is not commandable


def test_home_keyframe(workcell):
    model = compile_workcell(workcell, load_physics(default_config_dir() / "nominal_physics.yaml"))
    data = _home_data(model)
    qpos = data.qpos[joint_qpos_addresses(model, ALL_JOINTS)]
    np.testing.assert_allclose(qpos, [workcell.home_joint_positions[j] for j in ALL_JOINTS])
    np.testing.assert_allclose(data.ctrl[command_actuator_ids(model, COMMANDED_JOINTS)],
                               [workcell.home_joint_positions[j] for j in COMMANDED_JOINTS])
    box = joint_qpos_addresses(model, ["box_joint"])[0]
    np.testing.assert_allclose(data.qpos[box:box + 7], [*workcell.box.world_position_m, *workcell.box.world_quat_wxyz])


@pytest.mark.parametrize("camera", ["wrist_camera", "static_camera"])
def test_mujoco_camera_sits_on_the_urdf_optical_frame(workcell, camera):
    model = compile_workcell(workcell, load_physics(default_config_dir() / "nominal_physics.yaml"))
    data = _home_data(model)
    pin_model, pin_data = _pinocchio_at_home(workcell)
    world_T_optical = _world_T_frame(pin_model, pin_data, workcell.cameras[camera].color_optical_frame)
    cam = model.camera(camera).id
    world_R_optical = data.cam_xmat[cam].reshape(3, 3) @ MUJOCO_CAMERA_T_OPTICAL
    np.testing.assert_allclose(data.cam_xpos[cam], world_T_optical.translation, atol=1e-6)
    np.testing.assert_allclose(world_R_optical, world_T_optical.rotation, atol=1e-6)
    depth_frame = _world_T_frame(pin_model, pin_data, workcell.cameras[camera].depth_optical_frame)
    assert np.allclose(depth_frame.homogeneous, world_T_optical.homogeneous)  # aligned depth


def _joint4_motion_onset_s(model, *, threshold_rad=1e-3):
    """Time from a +0.2 rad step command on joint 4 to the first 1 mrad of motion."""
    data = _home_data(model)
    qpos = joint_qpos_addresses(model, ["panda_joint4"])[0]
    actuator = command_actuator_ids(model, ["panda_joint4"])[0]
    for _ in range(100):  # settle
        mujoco.mj_step(model, data)
    start_q, start_t = data.qpos[qpos], data.time
    data.ctrl[actuator] += 0.2
    while data.time - start_t < 0.5:
        mujoco.mj_step(model, data)
        if abs(data.qpos[qpos] - start_q) > threshold_rad:
            return data.time - start_t
    raise AssertionError("joint 4 never moved after a 0.2 rad step")


def test_command_delay_is_applied(workcell):
    onsets = {}
    for name in ("emulated_truth.yaml", "emulated_truth_slow.yaml"):
        physics = load_physics(default_config_dir() / name)
        model = compile_workcell(workcell, physics)
        delayed = _joint4_motion_onset_s(model)
        model.actuator_delay[:] = 0.0  # same plant, no delay: isolates the delay from the rise time
        immediate = _joint4_motion_onset_s(model)
        assert delayed - immediate == pytest.approx(physics.command_delay_s, abs=2 * TIMESTEP_S)
        onsets[name] = delayed
    slow, fast = onsets["emulated_truth_slow.yaml"], onsets["emulated_truth.yaml"]
    assert slow - fast > 0.025, f"slow truth moved at {slow * 1e3:.0f} ms, default truth at {fast * 1e3:.0f} ms"


def _sine_response(model: mujoco.MjModel, start_s: float) -> np.ndarray:
    """Joint 1 under a 1 Hz sine command sent every 2 ms, from `start_s` of simulated time."""
    data = mujoco.MjData(model)
    reset_to_home(model, data)
    actuator = command_actuator_ids(model, ["panda_joint1"])[0]
    home = float(data.ctrl[actuator])
    qpos = model.jnt_qposadr[model.joint("panda_joint1").id]
    mujoco.mj_step(model, data, nstep=int(round(start_s / model.opt.timestep)))  # the time grows by sums of dt
    out = []
    for k in range(500):
        data.ctrl[actuator] = home + 0.3 * np.sin(2 * np.pi * k * 0.002)
        mujoco.mj_step(model, data, nstep=2)
        out.append(data.qpos[qpos])
    return np.array(out)


def test_command_delay_acts_the_same_at_any_simulated_time(workcell):
    # A whole-step delay read exactly at a sample's time used to act one step longer or not
    # depending on round-off in the absolute time (seen after 10 s, not after 0 or 200 s).
    model = compile_workcell(workcell, load_physics(default_config_dir() / "emulated_truth.yaml"))
    reference = _sine_response(model, 0.0)
    for start_s in (10.0, 50.0, 123.4):
        np.testing.assert_allclose(_sine_response(model, start_s), reference, atol=1e-9, err_msg=f"from {start_s} s")
    one_step_longer = compile_workcell(workcell, load_physics(default_config_dir() / "emulated_truth.yaml"))
    one_step_longer.actuator_delay[:] = mujoco_actuator_delay(command_delay_of(model.actuator_delay[0]) + TIMESTEP_S)
    assert np.abs(_sine_response(one_step_longer, 0.0) - reference).max() > 1e-3  # the test can tell one step


# --------------------------------------------------------------------------- rendering

@pytest.fixture(scope="module")
def rendered_static_camera(workcell):
    return _render_static_camera(workcell, compile_workcell(workcell, load_physics(default_config_dir()
                                                                                   / "nominal_physics.yaml")))


def _render_static_camera(workcell, model):
    data = _home_data(model)
    intrinsics = workcell.cameras["static_camera"]
    renderer = mujoco.Renderer(model, intrinsics.height, intrinsics.width)
    try:
        renderer.update_scene(data, "static_camera")
        color = renderer.render().copy()
        renderer.enable_depth_rendering()
        renderer.update_scene(data, "static_camera")
        depth = renderer.render().copy()
    finally:
        renderer.close()
    return color, depth


def test_static_camera_depth_is_metric_at_the_table(workcell, rendered_static_camera):
    color, depth = rendered_static_camera
    intrinsics = workcell.cameras["static_camera"]
    assert color.shape == (480, 640, 3) and color.std() > 10  # not a blank frame
    # a table point clear of the board, the box and the robot, projected with the URDF pose
    table_point = np.array([0.62, 0.30, workcell.table_top_height_m])
    pin_model, pin_data = _pinocchio_at_home(workcell)
    world_T_camera = _world_T_frame(pin_model, pin_data, intrinsics.color_optical_frame)
    point_in_camera = world_T_camera.actInv(table_point)
    u = round(intrinsics.fx * point_in_camera[0] / point_in_camera[2] + intrinsics.cx)
    v = round(intrinsics.fy * point_in_camera[1] / point_in_camera[2] + intrinsics.cy)
    assert 0 <= u < intrinsics.width and 0 <= v < intrinsics.height
    z = float(depth[v, u])  # metric distance along the optical axis
    deprojected = np.array([(u - intrinsics.cx) * z / intrinsics.fx, (v - intrinsics.cy) * z / intrinsics.fy, z])
    world_point = world_T_camera.act(deprojected)
    assert world_point[2] == pytest.approx(workcell.table_top_height_m, abs=5e-3)
    np.testing.assert_allclose(world_point[:2], table_point[:2], atol=5e-3)


def _board_in_static_camera(workcell, color):
    """(rvec, tvec) of the ChArUco board seen in a static camera image (solvePnP)."""
    intrinsics = workcell.cameras["static_camera"]
    board = make_charuco_board(workcell.board)
    corners, ids, _, _ = cv2.aruco.CharucoDetector(board).detectBoard(cv2.cvtColor(color, cv2.COLOR_RGB2GRAY))
    assert ids is not None and len(ids) >= 12, "ChArUco board not detected in the static camera image"
    object_points, image_points = board.matchImagePoints(corners, ids)
    ok, rvec, tvec = cv2.solvePnP(object_points, image_points, np.array(intrinsics.camera_matrix), None)
    assert ok
    return rvec, tvec


def test_rendered_charuco_board_is_detected_at_its_urdf_pose(workcell, rendered_static_camera):
    """Texture orientation, camera intrinsics (incl. principal point) and pose all agree."""
    color, _ = rendered_static_camera
    intrinsics = workcell.cameras["static_camera"]
    rvec, tvec = _board_in_static_camera(workcell, color)
    pin_model, pin_data = _pinocchio_at_home(workcell)
    camera_T_board = (_world_T_frame(pin_model, pin_data, intrinsics.color_optical_frame).inverse()
                      * _world_T_frame(pin_model, pin_data, workcell.board.frame))
    # lateral error 1 px ~ 1.4 mm at 0.87 m: a principal point off by a pixel fails this
    np.testing.assert_allclose(tvec.ravel()[:2], camera_T_board.translation[:2], atol=0.5e-3)
    assert tvec.ravel()[2] == pytest.approx(camera_T_board.translation[2], abs=2e-3)
    rotation_error = np.linalg.norm(pinocchio.log3(cv2.Rodrigues(rvec)[0].T @ camera_T_board.rotation))
    assert rotation_error < np.radians(0.5)


def test_a_truth_camera_off_its_mount_renders_from_where_it_is(workcell):
    """A truth file's camera offset (unmodelled.camera_offsets) moves the rendering camera by
    that transform in its described optical frame: the board is seen from there, 2.2 cm and
    about 2 deg from the mount the description gives (which the camera's calibration must find)."""
    import dataclasses

    from twinloop_twin.physics import CameraOffset, PhysicsConfigError, UnmodelledEffects
    from twinloop_twin.scene import camera_offset_transform

    offset = CameraOffset("static_camera", (0.015, -0.012, 0.01), (1.0, -1.5, 0.8))
    nominal = load_physics(default_config_dir() / "nominal_physics.yaml")
    moved = dataclasses.replace(nominal, unmodelled=UnmodelledEffects(camera_offsets=(offset,)))
    color, _ = _render_static_camera(workcell, compile_workcell(workcell, moved))
    rvec, tvec = _board_in_static_camera(workcell, color)
    pin_model, pin_data = _pinocchio_at_home(workcell)
    mount = _world_T_frame(pin_model, pin_data, workcell.cameras["static_camera"].color_optical_frame)
    camera = mount * pinocchio.SE3(camera_offset_transform(offset))
    camera_T_board = camera.inverse() * _world_T_frame(pin_model, pin_data, workcell.board.frame)
    # the moved camera's view of the board, to the tolerances of the unmoved one above
    np.testing.assert_allclose(tvec.ravel()[:2], camera_T_board.translation[:2], atol=0.5e-3)
    assert tvec.ravel()[2] == pytest.approx(camera_T_board.translation[2], abs=2e-3)
    assert np.linalg.norm(pinocchio.log3(cv2.Rodrigues(rvec)[0].T @ camera_T_board.rotation)) < np.radians(0.5)
    # and not the mount's view: that one is off by about the offset
    mount_T_board = mount.inverse() * _world_T_frame(pin_model, pin_data, workcell.board.frame)
    assert np.linalg.norm(tvec.ravel() - mount_T_board.translation) > 0.01
    # a camera the workcell does not have: the file and the key named
    wrong = dataclasses.replace(moved, source="truth.yaml", unmodelled=UnmodelledEffects(
        camera_offsets=(dataclasses.replace(offset, camera="thermal_camera"),)))
    with pytest.raises(PhysicsConfigError, match=r"truth\.yaml: key 'unmodelled\.camera_offsets' names thermal_camera"):
        compile_workcell(workcell, wrong)


def test_texture_cache_is_reused(workcell, tmp_path, monkeypatch):
    from twinloop_twin.scene import charuco_texture_path
    monkeypatch.setenv("TWINLOOP_CACHE", str(tmp_path))
    first = charuco_texture_path(workcell.board)
    stamp = first.stat().st_mtime_ns
    assert charuco_texture_path(workcell.board) == first and first.stat().st_mtime_ns == stamp
    assert Path(first).parent == tmp_path
