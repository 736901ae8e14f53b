"""The simulated workcell behind the hardware contract, against known truth.

Commands are refused whole or applied clamped; resets hold; the sensor noise and the
command delay are the ones the truth file configures; the RGB-D rig honours the depth
range and the configured depth noise.
"""
from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede `import mujoco`

import dataclasses  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from twinloop_twin.contract import CommandRejected  # noqa: E402
from twinloop_sim.workcell_sim import CameraRig, WorkcellSimulation  # noqa: E402
from twinloop_twin.physics import ALL_JOINTS, load_physics  # noqa: E402
from twinloop_twin.scene import compile_workcell  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402

NOISE_SAMPLES = 2000


@pytest.fixture(scope="module")
def workcell():
    return load_workcell()


@pytest.fixture(scope="module")
def truth():
    return load_physics(default_config_dir() / "emulated_truth.yaml")


@pytest.fixture
def sim(workcell, truth):
    return WorkcellSimulation(workcell, truth, seed=0)


# ---------------------------------------------------------------------------------------
# Commands
# ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("names, positions, code", [
    (["panda_joint1", "panda_joint9"], [0.3, 0.1], "UNKNOWN_JOINT"),
    (["panda_joint1", "panda_joint2"], [0.3, math.nan], "NON_FINITE_COMMAND"),
    (["panda_joint1", "panda_joint2"], [0.3, -math.inf], "NON_FINITE_COMMAND"),
    (["panda_joint1", "panda_finger_joint2"], [0.3, 0.01], "UNKNOWN_JOINT"),  # the mimic joint has no actuator
])
def test_rejected_command_changes_no_target(sim, names, positions, code):
    before = sim.data.ctrl.copy()
    with pytest.raises(CommandRejected) as caught:
        sim.command(names, positions)
    assert caught.value.code == code
    np.testing.assert_array_equal(sim.data.ctrl, before)  # not even the valid panda_joint1


def test_valid_command_is_clamped_into_the_ctrlrange(sim):
    model = sim.model
    ranges = {name: tuple(model.actuator_ctrlrange[model.actuator(actuator).id])
              for name, actuator in (("panda_joint1", "panda_joint1"), ("panda_joint4", "panda_joint4"),
                                     ("panda_finger_joint1", "panda_gripper"))}
    home = sim.targets()
    targets = sim.command(["panda_finger_joint1", "panda_joint4", "panda_joint1"], [1.0, 0.5, -10.0])
    assert targets == {"panda_finger_joint1": 1.0, "panda_joint4": 0.5, "panda_joint1": -10.0}  # as sent
    applied = sim.targets()
    assert applied["panda_joint1"] == ranges["panda_joint1"][0] == pytest.approx(-2.8973)
    assert applied["panda_joint4"] == ranges["panda_joint4"][1] == pytest.approx(-0.0698)
    assert applied["panda_finger_joint1"] == ranges["panda_finger_joint1"][1] == pytest.approx(0.04)
    for name in ("panda_joint2", "panda_joint3", "panda_joint5", "panda_joint6", "panda_joint7"):
        assert applied[name] == home[name]  # joints the command does not name keep their targets
    sim.command(["panda_joint2"], [0.25])
    assert sim.targets()["panda_joint2"] == 0.25  # inside the range: applied exactly


# ---------------------------------------------------------------------------------------
# Reset
# ---------------------------------------------------------------------------------------

def test_reset_with_joint_override_puts_and_holds_the_arm_there(sim, workcell):
    override = {"panda_joint1": 0.5, "panda_joint4": -1.9, "panda_joint6": 2.0, "panda_finger_joint1": 0.02}
    sim.step_until(0.3)
    sim.reset(override)
    assert sim.time_s == 0.0
    expected = {**workcell.home_joint_positions, **override}
    start = sim.true_joint_positions()
    for name in ("panda_joint1", "panda_joint4", "panda_joint6", "panda_finger_joint1", "panda_joint2"):
        assert start[name] == pytest.approx(expected[name], abs=1e-12)
    assert sim.targets()["panda_joint1"] == 0.5
    # held all along, not only in the end: the delayed-command buffer must hold the override
    # too, or the arm first chases the home targets for the command delay
    commanded = [name for name in ALL_JOINTS if name != "panda_finger_joint2"]
    worst = dict.fromkeys(commanded, 0.0)
    for k in range(1, 1001):
        assert sim.step_until(k * 1e-3) == 1
        now = sim.true_joint_positions()
        for name in commanded:
            worst[name] = max(worst[name], abs(now[name] - expected[name]))
    assert sim.time_s == pytest.approx(1.0)
    assert max(worst.values()) < 2e-3, worst
    # finger 2 mimics finger 1 through an equality constraint: it follows the override
    assert abs(now["panda_finger_joint2"] - override["panda_finger_joint1"]) < 1e-4  # m


def test_reset_rejects_an_unknown_joint(sim):
    with pytest.raises(CommandRejected) as caught:
        sim.reset({"panda_joint8": 0.0})
    assert caught.value.code == "UNKNOWN_JOINT"


def test_reset_box_false_keeps_a_moved_box_and_the_default_puts_it_back(sim, workcell):
    nominal = sim.box_qpos()
    np.testing.assert_allclose(nominal[:3], workcell.box.world_position_m, atol=1e-12)
    sim.step_until(0.2)
    box = sim._box_qpos_slice()  # noqa: SLF001 - the test moves the box by hand
    moved = nominal.copy()
    moved[:2] += (0.1, 0.05)
    moved[3:] = (math.cos(0.3), 0.0, 0.0, math.sin(0.3))  # turned 0.6 rad about z
    sim.data.qpos[box] = moved
    sim.reset({"panda_joint1": 0.2}, reset_box=False)
    np.testing.assert_array_equal(sim.box_qpos(), moved)
    assert sim.true_joint_positions()["panda_joint1"] == 0.2
    sim.reset()
    np.testing.assert_array_equal(sim.box_qpos(), nominal)


# ---------------------------------------------------------------------------------------
# Sensor noise and determinism
# ---------------------------------------------------------------------------------------

def test_joint_state_noise_has_the_configured_std(sim, truth):
    true_position = sim.data.qpos[sim._qpos].copy()  # noqa: SLF001
    true_velocity = sim.data.qvel[sim._dof].copy()  # noqa: SLF001
    true_effort = sim.data.qfrc_actuator[sim._dof].copy()  # noqa: SLF001
    samples = [sim.joint_state() for _ in range(NOISE_SAMPLES)]  # at rest: no stepping in between
    assert samples[0].names == tuple(ALL_JOINTS)
    for field, true, std in (("position", true_position, truth.noise.joint_position_std_rad),
                             ("velocity", true_velocity, truth.noise.joint_velocity_std_rad_s),
                             ("effort", true_effort, truth.noise.joint_effort_std_nm)):
        error = np.array([getattr(s, field) for s in samples]) - true
        measured = error.std(axis=0)
        np.testing.assert_allclose(measured, std, rtol=0.15, err_msg=field)
        # zero mean: 5 standard errors
        assert np.all(np.abs(error.mean(axis=0)) < 5 * std / math.sqrt(NOISE_SAMPLES)), field


def _run(sim: WorkcellSimulation) -> np.ndarray:
    readings = []
    for k in range(1, 51):
        if k == 10:
            sim.command(["panda_joint2", "panda_finger_joint1"], [-0.6, 0.03])
        sim.step_until(k * 0.002)
        readings.append(np.concatenate([sim.joint_state().position, sim.joint_state().effort]))
    return np.array(readings)


def test_same_seed_gives_identical_runs_and_different_seeds_differ(workcell, truth):
    first = _run(WorkcellSimulation(workcell, truth, seed=11))
    again = _run(WorkcellSimulation(workcell, truth, seed=11))
    other = _run(WorkcellSimulation(workcell, truth, seed=12))
    np.testing.assert_array_equal(first, again)
    # different seeds: every noisy reading differs, by about the noise std (not by physics)
    assert np.all(first != other)
    position_difference = (first - other)[:, : len(ALL_JOINTS)]
    assert position_difference.std() == pytest.approx(math.sqrt(2) * truth.noise.joint_position_std_rad, rel=0.2)


# ---------------------------------------------------------------------------------------
# Command delay
# ---------------------------------------------------------------------------------------

def _first_motion_s(sim: WorkcellSimulation, joint: str, step_rad: float, threshold_rad: float = 1e-3) -> float:
    start = sim.true_joint_positions()[joint]
    sim.command([joint], [start + step_rad])
    for k in range(1, 200):
        sim.step_until(k * sim.timestep_s)
        if abs(sim.true_joint_positions()[joint] - start) > threshold_rad:
            return sim.time_s
    raise AssertionError(f"{joint} did not move {threshold_rad} rad within 0.2 s")


@pytest.mark.parametrize("truth_file", ["emulated_truth.yaml", "emulated_truth_slow.yaml"])
@pytest.mark.parametrize("joint", ["panda_joint1", "panda_joint4"])
def test_configured_command_delay_is_applied(workcell, truth_file, joint):
    physics = load_physics(default_config_dir() / truth_file)
    assert physics.command_delay_s > 0.005  # a delay that a 2 ms tolerance can tell from zero
    delayed = WorkcellSimulation(workcell, physics)
    undelayed_model = compile_workcell(workcell, physics)
    # the history buffer is sized for MAX_COMMAND_DELAY_S, so the delay can change at run time
    assert np.all(undelayed_model.actuator_history[:, 0] * undelayed_model.opt.timestep >= physics.command_delay_s)
    undelayed_model.actuator_delay[:] = 0.0
    undelayed = WorkcellSimulation(workcell, physics, model=undelayed_model)
    lag_s = _first_motion_s(delayed, joint, 0.05) - _first_motion_s(undelayed, joint, 0.05)
    assert lag_s == pytest.approx(physics.command_delay_s, abs=0.002)


# ---------------------------------------------------------------------------------------
# Cameras
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rig_inputs(workcell, truth):
    model = compile_workcell(workcell, truth)
    home = WorkcellSimulation(workcell, truth, model=model)
    return model, home.data.qpos.copy()


def _noise_free(noise):
    return dataclasses.replace(noise, depth_std_m=0.0, color_std=0.0)


# a patch of bare table in the static camera's view (front-left, away from board, box and robot)
TABLE_PATCH = (slice(380, 460), slice(40, 200))


def test_depth_noise_has_the_configured_std_on_a_flat_table_patch(workcell, truth, rig_inputs):
    model, qpos = rig_inputs
    noisy = CameraRig(model, {"static_camera": workcell.cameras["static_camera"]}, truth.noise, seed=5)
    clean = CameraRig(model, {"static_camera": workcell.cameras["static_camera"]}, _noise_free(truth.noise))
    try:
        noisy.set_state(qpos)
        clean.set_state(qpos)
        _, depth_clean = clean.render("static_camera")
        _, depth_noisy = noisy.render("static_camera")
    finally:
        noisy.close()
        clean.close()
    patch_clean = depth_clean[TABLE_PATCH].astype(float)
    # the patch is table: all valid, at 0.6-0.9 m, and smooth (a plane; steps < 5 mm between pixels)
    assert np.all((patch_clean > 600) & (patch_clean < 900))
    assert np.abs(np.diff(patch_clean, axis=1)).max() <= 5
    difference_mm = depth_noisy[TABLE_PATCH].astype(float) - patch_clean
    # both images are rounded to whole mm: the difference has var σ² + 2/12 mm²
    expected_mm = math.sqrt((truth.noise.depth_std_m * 1e3) ** 2 + 2 / 12)
    assert difference_mm.std() == pytest.approx(expected_mm, rel=0.2)
    assert abs(difference_mm.mean()) < 0.1


def test_depth_outside_the_sensor_range_reads_zero(workcell, truth, rig_inputs):
    model, qpos = rig_inputs
    configured = workcell.cameras["static_camera"]
    narrow = dataclasses.replace(configured, depth_min_m=0.70, depth_max_m=0.90)
    full = CameraRig(model, {"static_camera": configured}, _noise_free(truth.noise))
    clipped = CameraRig(model, {"static_camera": narrow}, _noise_free(truth.noise))
    try:
        full.set_state(qpos)
        clipped.set_state(qpos)
        _, depth_full = full.render("static_camera")
        _, depth_clipped = clipped.render("static_camera")
    finally:
        full.close()
        clipped.close()
    depth_full = depth_full.astype(int)
    # the configured range clips the far background to 0 and keeps nothing beyond 3 m
    assert np.any(depth_full == 0)
    assert depth_full.max() <= configured.depth_max_m * 1000
    assert depth_full[depth_full > 0].min() >= configured.depth_min_m * 1000
    # a narrowed range: zero outside [0.70, 0.90] m, untouched inside (1 mm of rounding at the edges)
    inside = (depth_full > 701) & (depth_full < 899)
    outside = (depth_full < 699) | (depth_full > 901)
    assert inside.sum() > 10_000 and outside.sum() > 10_000
    np.testing.assert_array_equal(depth_clipped[inside], depth_full[inside])
    assert np.all(depth_clipped[outside] == 0)


def test_color_and_depth_have_the_configured_size_and_encoding(workcell, truth, rig_inputs):
    model, qpos = rig_inputs
    small = dataclasses.replace(workcell.cameras["wrist_camera"], width=160, height=120,
                                fx=153.75, fy=153.75, cx=80.0, cy=60.0)
    cameras = {"static_camera": workcell.cameras["static_camera"], "wrist_camera": small}
    rig = CameraRig(model, cameras, truth.noise)
    try:
        rig.set_state(qpos)
        for name, intrinsics in cameras.items():
            rgb, depth = rig.render(name)
            assert rgb.dtype == np.uint8 and rgb.shape == (intrinsics.height, intrinsics.width, 3), name
            assert depth.dtype == np.uint16 and depth.shape == (intrinsics.height, intrinsics.width), name
            assert rgb.std() > 10  # a scene, not a blank frame
    finally:
        rig.close()
