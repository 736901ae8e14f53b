"""The Isaac Sim path, as far as it runs without Isaac Sim: the USD export a twin produces
(checked with usd-core against the MuJoCo model it came from) and the contract wiring of
the script that runs inside Isaac Sim."""
import ast
import math
import subprocess
import sys
from pathlib import Path

import mujoco
import numpy as np
import pytest
from pxr import Usd, UsdGeom, UsdPhysics

from twinloop_sim import isaac_twin_bridge
from twinloop_twin.contract import ContractTopics
from twinloop_twin.nominal import build_twin_from_physics, load_scene
from twinloop_twin.scene import acting_command_delay
from twinloop_twin.usd_export import export_twin_usd
from twinloop_twin.workcell import default_config_dir


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("twins")
    twin = build_twin_from_physics(root, "emulated", default_config_dir() / "emulated_truth.yaml",
                                   created_by="test", source="truth", note="usd export test", version=0)
    path = export_twin_usd(twin, root / "twin.usda")
    model = load_scene(twin)
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    mujoco.mj_kinematics(model, data)
    return Usd.Stage.Open(str(path)), model, data, twin


def _world(stage, path) -> np.ndarray:
    matrix = UsdGeom.Xformable(stage.GetPrimAtPath(path)).ComputeLocalToWorldTransform(Usd.TimeCode.Default())
    return np.array(matrix).T  # USD is row-vector


def test_rigid_bodies_carry_the_twin_masses(exported):
    stage, model, _, twin = exported
    for body in ("panda_link3", "panda_hand", "box"):
        mass = UsdPhysics.MassAPI(stage.GetPrimAtPath(f"/World/twin/{body}")).GetMassAttr().Get()
        assert mass == pytest.approx(model.body_mass[model.body(body).id], rel=1e-6)
    assert UsdPhysics.MassAPI(stage.GetPrimAtPath("/World/twin/box")).GetMassAttr().Get() == pytest.approx(
        twin.parameters["box.mass_kg"].mean, rel=1e-5)
    roots = [p for p in stage.Traverse() if p.HasAPI(UsdPhysics.ArticulationRootAPI)]
    assert [str(p.GetPath()) for p in roots] == [isaac_twin_bridge.ARTICULATION]


def test_joints_drives_and_frames_match_the_twin(exported):
    stage, model, _, twin = exported
    for index in range(1, 8):
        name = f"panda_joint{index}"
        prim = stage.GetPrimAtPath(f"/World/twin/joints/{name}")
        assert prim.IsA(UsdPhysics.RevoluteJoint)
        drive = UsdPhysics.DriveAPI(prim, "angular")
        # USD angular drives are per degree
        assert drive.GetStiffnessAttr().Get() == pytest.approx(
            twin.parameters[f"actuator.{name}.kp"].mean * math.pi / 180, rel=1e-5)
        assert prim.GetAttribute("twinloop:frictionLoss").Get() == pytest.approx(
            twin.parameters[f"joint.{name}.friction_loss"].mean, rel=1e-5)
        joint = UsdPhysics.Joint(prim)
        # the joint frame seen from both bodies is one frame at the home pose
        b0, b1 = (str(joint.GetBody0Rel().GetTargets()[0]), str(joint.GetBody1Rel().GetTargets()[0]))
        p0 = _world(stage, b0) @ np.append(np.array(joint.GetLocalPos0Attr().Get()), 1.0)
        p1 = _world(stage, b1) @ np.append(np.array(joint.GetLocalPos1Attr().Get()), 1.0)
        np.testing.assert_allclose(p0, p1, atol=1e-5)
        lo, hi = model.jnt_range[model.joint(name).id]
        assert UsdPhysics.RevoluteJoint(prim).GetUpperLimitAttr().Get() == pytest.approx(math.degrees(hi), rel=1e-5)
    assert stage.GetPrimAtPath("/World/twin/joints/panda_finger_joint2").GetAttribute(
        "twinloop:mimicJoint").Get() == "panda_finger_joint1"
    assert stage.GetPrimAtPath("/World/twin").GetAttribute("twinloop:commandDelay_s").Get() == pytest.approx(
        acting_command_delay(twin.parameters["command.delay_s"].mean))  # the whole step MuJoCo's scene acts


def test_cameras_sit_at_the_scene_cameras(exported):
    stage, model, data, _ = exported
    cameras = {p.GetName(): p for p in stage.Traverse() if p.IsA(UsdGeom.Camera)}
    assert set(cameras) == {"wrist_camera", "static_camera"}
    for name, prim in cameras.items():
        world = _world(stage, prim.GetPath())
        camera = model.camera(name).id
        np.testing.assert_allclose(world[:3, 3], data.cam_xpos[camera], atol=1e-5)
        np.testing.assert_allclose(world[:3, :3], data.cam_xmat[camera].reshape(3, 3), atol=1e-5)


def test_script_wires_exactly_the_contract_topics():
    topics = ContractTopics()
    assert isaac_twin_bridge.JOINT_STATES == topics.joint_states
    assert isaac_twin_bridge.JOINT_COMMAND == topics.joint_command
    assert isaac_twin_bridge.CLOCK == topics.clock
    for camera in ("wrist_camera", "static_camera"):
        wired = {k: v.format(camera=camera) for k, v in isaac_twin_bridge.CAMERA_TOPICS.items()}
        assert wired == ContractTopics.camera(camera)
    # every topic string the script names is one of the above
    source = Path(isaac_twin_bridge.__file__).read_text()
    literals = {n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant)
                and isinstance(n.value, str) and n.value.startswith("/") and "World" not in n.value}
    allowed = {topics.joint_states, topics.joint_command, topics.clock, *isaac_twin_bridge.CAMERA_TOPICS.values()}
    assert literals <= allowed, literals - allowed


def test_delayed_commands_apply_after_the_twin_delay_and_refuse_unknown_joints():
    commands = isaac_twin_bridge.DelayedCommands(0.008, ["panda_joint1", "panda_joint2"])
    commands.due(1.000)
    commands.push(["panda_joint2"], [0.5])
    assert commands.due(1.007) is None
    assert commands.due(1.008) == [0.0, 0.5]
    commands.push(["elbow"], [1.0])
    assert commands.due(2.0) is None


def test_outside_isaac_sim_the_script_says_how_to_run_it(tmp_path):
    result = subprocess.run([sys.executable, "-m", "twinloop_sim.isaac_twin_bridge", "--usd", str(tmp_path / "x.usda")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "inside Isaac Sim" in result.stderr
