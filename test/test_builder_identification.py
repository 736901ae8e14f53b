"""Physics identification (twinloop_builder) against known truth, without DDS.

Data: sessions simulated in-process by twinloop_builder.synthetic (the emulated workcell's
own simulation class on a truth file, with that file's sensor noise, stepped and sampled as
the node does; no DDS jitter). The end-to-end path over DDS and the recorder is
test/test_builder_node.py. Tolerances are stated at each assertion.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import yaml

from twinloop_builder import identification as ident
from twinloop_builder.build import REPORT_FILE, build_identified_twin
from twinloop_builder.excitation import (DEFAULT_ACCELERATION_LIMITS, ExcitationError, JointExcitationConfig,
                                         WorkspaceChecker, approach, joint_excitation, load_excitation_config,
                                         motion_limits, push_trajectory)
from twinloop_builder.recording import MissingTopic, TooShort, WrongJointNames, WrongSplit, load_recording
from twinloop_builder.synthetic import simulate_session, write_bag
from twinloop_twin.bundle import load_twin_version
from twinloop_twin.nominal import build_nominal_twin, load_scene, physics_parameters
from twinloop_twin.physics import ARM_JOINTS, COMMANDED_JOINTS, load_physics
from twinloop_twin.scene import build_workcell_spec, command_delay_of
from twinloop_twin.workcell import default_config_dir, load_workcell

FIT_S = 8.0  # s of joint excitation in the fit sessions (the benchmark scales 30/60/120 s)
HELD_OUT_S = 5.0
AMPLITUDE = {**{j: 0.4 for j in ARM_JOINTS}, "panda_finger_joint1": 0.0}
# Goals of the issue: gains, damping, mass within 5 %; delay within 1 ms; held-out RMSE
# ratio <= 0.3. Friction loss and armature are checked against their intervals only.
GOAL = {"kp": 0.05, "kv": 0.05, "damping": 0.05, "mass_kg": 0.05}


@pytest.fixture(scope="module")
def workcell():
    return load_workcell()


@pytest.fixture(scope="module")
def nominal():
    return load_physics(default_config_dir() / "nominal_physics.yaml")


@pytest.fixture(scope="module")
def spec(workcell, nominal):
    return build_workcell_spec(workcell, nominal)


def excitation(workcell, spec, duration_s, seed, excite=None):
    config = JointExcitationConfig(duration_s=duration_s, ramp_s=1.0, amplitude=AMPLITUDE, seed=seed)
    return joint_excitation(config, workcell.home_joint_positions, spec.compile(), workcell.urdf_xml,
                            workcell.table_top_height_m, excite=excite)


def identify_truth(truth_file, workcell, nominal, spec):
    truth = load_physics(default_config_dir() / truth_file)
    fit = simulate_session(workcell, truth, [excitation(workcell, spec, FIT_S, 0)], name="fit", seed=1)
    held = simulate_session(workcell, truth, [excitation(workcell, spec, HELD_OUT_S, 7)], name="held",
                            split="held_out", seed=2)
    # 36 intervals at once: Bonferroni, so that the family of intervals holds at 95 % (at 95 %
    # each, ~2 of 36 truths would fall outside by chance alone)
    settings = ident.IdentificationSettings(confidence=1.0 - 0.05 / 36)
    result = ident.identify(spec, physics_parameters(nominal, source="nominal").means(), [fit], held_out=[held],
                            settings=settings)
    return physics_parameters(truth, source="truth").means(), result


@pytest.fixture(scope="module")
def truth_a(workcell, nominal, spec):
    return identify_truth("emulated_truth.yaml", workcell, nominal, spec)


@pytest.fixture(scope="module")
def truth_b(workcell, nominal, spec):
    return identify_truth("emulated_truth_slow.yaml", workcell, nominal, spec)


def check_recovery(truth, result):
    checked = 0
    problems = []
    for name, estimate in result.estimates.items():
        if not estimate.identifiable:
            continue
        checked += 1
        value = truth[name]
        if not estimate.ci_low <= value <= estimate.ci_high:
            problems.append(f"{name}: truth {value:.5g} outside [{estimate.ci_low:.5g}, {estimate.ci_high:.5g}]")
        quantity = name.split(".")[-1]
        if quantity in GOAL and abs(estimate.mean / value - 1) > GOAL[quantity]:
            problems.append(f"{name}: {estimate.mean:.5g} vs truth {value:.5g} ({estimate.mean / value - 1:+.1%})")
    delay = result.estimates["command.delay_s"]
    assert delay.identifiable
    assert abs(delay.mean - truth["command.delay_s"]) <= 0.001, delay  # <= 1 ms
    assert not problems, "\n".join(problems)
    # every arm gain is identified from this excitation (they carry the efforts)
    assert all(result.estimates[f"actuator.{j}.kp"].identifiable for j in ARM_JOINTS)
    assert checked >= 25, f"only {checked} parameters identifiable"
    ratio = result.held_out_rmse_after_rad / result.held_out_rmse_before_rad
    print(f"held-out joint RMSE {result.held_out_rmse_before_rad * 1e3:.3f} -> "
          f"{result.held_out_rmse_after_rad * 1e3:.4f} mrad (ratio {ratio:.3f}); {checked} identifiable")
    assert ratio <= 0.3


def test_default_truth_is_recovered(truth_a):
    check_recovery(*truth_a)


def test_second_truth_is_recovered_equally_well(truth_b):
    check_recovery(*truth_b)


def test_mimic_finger_and_unexcited_gripper_are_flagged(truth_a):
    _, result = truth_a
    for quantity in ("friction_loss", "damping", "armature"):
        for joint in ("panda_finger_joint1", "panda_finger_joint2"):
            assert not result.estimates[f"joint.{joint}.{quantity}"].identifiable
    assert "never moved" in result.estimates["actuator.panda_finger_joint1.kp"].note


def test_joint_that_never_moves_is_flagged_not_identifiable(workcell, nominal, spec):
    truth = load_physics(default_config_dir() / "emulated_truth.yaml")
    moving = tuple(j for j in ARM_JOINTS if j != "panda_joint4")
    fit = simulate_session(workcell, truth, [excitation(workcell, spec, 6.0, 3, excite=moving)], seed=4)
    assert fit.motion_range()["panda_joint4"] < 0.01  # it is held (only dragged by the others)
    prior = physics_parameters(nominal, source="nominal").means()
    # fitting joint 2 and the delay keeps this test short; joint 4 is judged before any fit
    result = ident.identify(spec, prior, [fit], select=["joint.panda_joint2", "actuator.panda_joint2", "command"])
    for quantity in ("joint.panda_joint4.friction_loss", "joint.panda_joint4.damping", "joint.panda_joint4.armature",
                     "actuator.panda_joint4.kp", "actuator.panda_joint4.kv"):
        estimate = result.estimates[quantity]
        assert not estimate.identifiable, quantity
        assert estimate.mean == prior[quantity]  # no confident number: the prior stays
        assert "never moved" in estimate.note and "panda_joint4" in estimate.note
    assert any("panda_joint4 never moved" in g for g in result.guidance)
    assert result.estimates["actuator.panda_joint2.kp"].identifiable


def test_box_mass_and_friction_from_pushes(workcell, nominal, spec):
    truth = load_physics(default_config_dir() / "emulated_truth.yaml")
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    pushes = [lambda box, p=p: push_trajectory(p, box, workcell.box.size_m[0] / 2, workcell.home_joint_positions,
                                               checker, max_speed=max_speed, max_acceleration=max_acceleration)
              for p in config.pushes]
    fit = simulate_session(workcell, truth, pushes, seed=5)
    assert np.linalg.norm(fit.box_pose[-1, :2] - fit.box_pose[0, :2]) > 0.05  # the box was pushed
    truth_values = physics_parameters(truth, source="truth").means()
    prior = dict(truth_values)  # the arm as identified (here: known); the box at its nominal values
    for name in ident.BOX_PARAMETERS:
        prior[name] = physics_parameters(nominal, source="nominal").means()[name]
    result = ident.identify(spec, prior, [fit], select=list(ident.BOX_PARAMETERS))
    product = result.derived["box.mass_kg*box.friction"]
    truth_values[product.name] = truth_values["box.mass_kg"] * truth_values["box.friction"]
    for name, estimate in [*((n, result.estimates[n]) for n in ident.BOX_PARAMETERS), (product.name, product)]:
        print(f"{name}: {estimate.mean:.4f} ± {estimate.std:.4f} (truth {truth_values[name]:.4f}), "
              f"{'identifiable' if estimate.identifiable else 'not identifiable'}")
        # whatever is claimed holds: the truth inside the interval, and within the goal
        if estimate.identifiable:
            assert estimate.ci_low <= truth_values[name] <= estimate.ci_high, estimate
            assert abs(estimate.mean / truth_values[name] - 1) <= 0.05, estimate
    # Contacts make the cost chaotic in the parameters; the Nelder-Mead search still lands near
    # the truth (seen: mass -3.7 %, box friction +1.9 %, product -1.9 %, finger friction -11 %;
    # Levenberg-Marquardt stalled 6-30 % off) ...
    for name in ("box.mass_kg", "box.friction", product.name):
        assert abs(result.estimates.get(name, product).mean / truth_values[name] - 1) <= 0.05, name
    # ... and what the three pushes cannot separate is flagged, with what to record instead.
    for name in ident.BOX_PARAMETERS:
        if not result.estimates[name].identifiable:
            assert "not identifiable" in result.estimates[name].note and "add" in result.estimates[name].note


def test_excitation_is_safe_and_starts_and_ends_at_home(workcell, spec):
    trajectory = excitation(workcell, spec, 10.0, 0)
    home = np.array([workcell.home_joint_positions[j] for j in trajectory.joints])
    assert np.allclose(trajectory.positions[0], home) and np.allclose(trajectory.positions[-1], home)
    model = spec.compile()
    low, high = model.jnt_range[[model.joint(j).id for j in ARM_JOINTS]].T
    arm = trajectory.positions[:, :7]
    assert np.all(arm >= low + 0.1) and np.all(arm <= high - 0.1)  # 0.15 rad margin configured
    speed = np.abs(np.diff(arm, axis=0)) / np.diff(trajectory.t)[:, None]
    assert np.all(speed <= 0.5 * 2.61 + 1e-6)  # half the URDF velocity limit
    assert np.all(np.ptp(arm, axis=0) > 0.3)  # and it does excite every arm joint
    checker = WorkspaceChecker(model, workcell.table_top_height_m)
    for row in trajectory.positions[::25]:
        assert not checker.violations(dict(zip(trajectory.joints, row)))
    # Per command step, as the envelope monitor checks it: accelerations within the limits
    # (config/envelope.yaml's, the excitation's defaults).
    accel = np.abs(np.diff(trajectory.positions, 2, axis=0)) / (trajectory.t[1] - trajectory.t[0]) ** 2
    limits = np.array([DEFAULT_ACCELERATION_LIMITS[j] for j in trajectory.joints])
    assert np.all(accel <= limits + 1e-6), (accel.max(0) / limits).round(2)


def test_approach_moves_from_the_measured_pose_within_limits(workcell, spec):
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    trajectory = excitation(workcell, spec, 6.0, 0)
    home = dict(workcell.home_joint_positions)
    # At rest within noise of the start: nothing to add.
    assert approach({**home, "panda_joint1": home["panda_joint1"] + 1e-4}, trajectory, max_speed=max_speed,
                    max_acceleration=max_acceleration) is None
    # The gripper 0.4 mm short of its start (a 0.1 m/s step over 4 ms, the monitor's limit) and
    # joint 1 off by 0.1 rad: a smooth move there, the trajectory's first row right after it.
    start = {**home, "panda_finger_joint1": home["panda_finger_joint1"] - 4e-4, "panda_joint1": home["panda_joint1"]
             - 0.1}
    lead = approach(start, trajectory, max_speed=max_speed, max_acceleration=max_acceleration)
    joined = lead.then(trajectory).positions
    assert np.allclose(joined[0], [start[j] for j in trajectory.joints])
    dt = trajectory.t[1] - trajectory.t[0]
    assert np.all(np.abs(np.diff(joined, axis=0)).max(0) / dt <= [max_speed[j] + 1e-9 for j in trajectory.joints])
    assert np.all(np.abs(np.diff(joined, 2, axis=0)).max(0) / dt**2
                  <= [max_acceleration[j] + 1e-9 for j in trajectory.joints])


def test_pushes_keep_to_joint_speed_and_acceleration_limits(workcell, spec):
    """The pushes of config/excitation.yaml pass the envelope monitor's per-step checks:
    the IK tracks each step (no staircase) and segments too fast for the joints are slowed."""
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
    home = np.array([workcell.home_joint_positions[j] for j in COMMANDED_JOINTS])
    for push in config.pushes:
        path = push_trajectory(push, np.array(workcell.box.world_position_m), workcell.box.size_m[0] / 2,
                               workcell.home_joint_positions, checker, max_speed=max_speed,
                               max_acceleration=max_acceleration)
        dt = path.t[1] - path.t[0]
        speed = np.abs(np.diff(path.positions, axis=0)).max(0) / dt
        accel = np.abs(np.diff(path.positions, 2, axis=0)).max(0) / dt**2
        assert np.all(speed <= [max_speed[j] + 1e-9 for j in path.joints]), speed
        assert np.all(accel <= [max_acceleration[j] + 1e-9 for j in path.joints]), accel
        assert np.allclose(path.positions[0], home) and np.allclose(path.positions[-1], home)
        assert path.slowed >= 1.0 and path.duration_s < 10.0
    # 0.35 m/s through the box is beyond what joint 2 can do here: that push is slowed.
    fast = push_trajectory(config.pushes[1], np.array(workcell.box.world_position_m), workcell.box.size_m[0] / 2,
                           workcell.home_joint_positions, checker, max_speed=max_speed,
                           max_acceleration=max_acceleration)
    assert fast.slowed > 1.5


def test_unsafe_excitation_is_refused(workcell, spec):
    config = JointExcitationConfig(duration_s=5.0, ramp_s=1.0, amplitude=AMPLITUDE, min_tcp_height_m=2.0)
    with pytest.raises(ExcitationError, match="lower the amplitudes"):
        joint_excitation(config, workcell.home_joint_positions, spec.compile(), workcell.urdf_xml,
                         workcell.table_top_height_m)


# ----------------------------------------------------------------------------- bags and the twin

@pytest.fixture(scope="module")
def short_session(workcell, spec):
    truth = load_physics(default_config_dir() / "emulated_truth.yaml")
    return simulate_session(workcell, truth, [excitation(workcell, spec, 6.0, 11)], name="short", seed=6)


def test_bad_bags_get_clear_errors(tmp_path, short_session):
    too_short = dataclasses.replace(short_session, **{
        f: getattr(short_session, f)[short_session.state_t < 2.0] for f in ("state_t", "position", "velocity", "effort")})
    with pytest.raises(TooShort, match="shorter than"):
        load_recording(write_bag(too_short, tmp_path / "short"), expected_split="fit")
    with pytest.raises(MissingTopic, match="/joint_command"):
        load_recording(write_bag(short_session, tmp_path / "no_cmd", skip_topics=["/joint_command"]))
    renamed = [f"fr3_joint{i}" for i in range(1, 8)] + ["fr3_finger_joint1", "fr3_finger_joint2"]
    with pytest.raises(WrongJointNames, match="another robot"):
        load_recording(write_bag(short_session, tmp_path / "fr3", joint_names=renamed))
    held_out = write_bag(short_session, tmp_path / "held", split="held_out")
    with pytest.raises(WrongSplit, match="held-out recordings validate the twin and never fit it"):
        load_recording(held_out, expected_split="fit")


def test_command_times_come_from_the_workcells_applied_stamps(tmp_path, short_session):
    # The recorder logged every command 3.1 ms after the workcell applied it.
    late_s, applied = 0.0031, "/twinloop/emulated_workcell/applied_command"
    exact = load_recording(write_bag(short_session, tmp_path / "applied", applied_topic=applied,
                                     command_log_delay_s=late_s))
    assert exact.command_timing == "applied"
    np.testing.assert_allclose(exact.command_t, short_session.command_t, rtol=0.0, atol=1e-9)
    np.testing.assert_array_equal(exact.command, short_session.command)
    # Without the workcell's stamps: the start of the 2 ms period each was logged in.
    logged = load_recording(write_bag(short_session, tmp_path / "logged", command_log_delay_s=late_s))
    assert logged.command_timing == "log"
    np.testing.assert_allclose(logged.command_t - short_session.command_t, 0.002, rtol=0.0, atol=1e-6)


def test_build_writes_an_identified_twin_version(tmp_path, workcell, short_session):
    root = tmp_path / "twins"
    build_nominal_twin(root, "emulated")
    fit_bag = write_bag(short_session, tmp_path / "fit_bag")
    held_out_bag = write_bag(short_session, tmp_path / "held_bag", split="held_out")
    with pytest.raises(WrongSplit):  # a held-out bag given as fit data: refused, nothing written
        build_identified_twin(root, "emulated", [held_out_bag])
    stages = []
    built = build_identified_twin(root, "emulated", [fit_bag], [held_out_bag],
                                  select=["actuator.panda_joint2", "command"],
                                  progress=lambda stage, fraction, message: stages.append((stage, fraction)))
    twin = load_twin_version(root, "emulated")
    assert twin.version == 1 and twin.manifest.provenance.parent_version == 0
    assert [b.split for b in twin.manifest.provenance.source_bags] == ["fit", "held_out"]
    assert len(twin.manifest.provenance.source_bags[0].sha256) == 64
    kp = twin.parameters["actuator.panda_joint2.kp"]
    assert kp.identifiable and kp.source == "identified" and kp.std > 0
    # only joint 2's gains and the delay were fitted, the rest held nominal, so kp is biased
    # here (the full fits above test accuracy); it is a measured value, not the prior
    assert kp.mean != 2000.0 and "interval" in kp.note
    untouched = twin.parameters["joint.panda_joint5.damping"]
    assert not untouched.identifiable and untouched.mean == load_twin_version(root, "emulated", 0).parameters[
        "joint.panda_joint5.damping"].mean
    model = load_scene(twin)  # the scene carries the identified values
    assert model.actuator_gainprm[model.actuator("panda_joint2").id, 0] == pytest.approx(kp.mean, rel=1e-5)  # XML digits
    assert command_delay_of(model.actuator_delay[0]) == pytest.approx(round(twin.parameters["command.delay_s"].mean, 3))
    report = yaml.safe_load(twin.file_path(REPORT_FILE).read_text())
    assert report["held_out"]["joint_rmse_after_rad"] < report["held_out"]["joint_rmse_before_rad"]
    assert stages[0][0] == "reading" and stages[-1] == ("done", 1.0)
    assert math.isfinite(built.result.held_out_rmse_after_rad)


def test_excitation_file_loads():
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    assert config.joints.duration_s > 2 * config.joints.ramp_s and config.pushes


def test_cli_refuses_a_held_out_bag_as_fit_data(tmp_path, short_session, capsys):
    from twinloop_builder.cli import main
    root = tmp_path / "twins"
    build_nominal_twin(root, "emulated")
    held_out_bag = write_bag(short_session, tmp_path / "held", split="held_out")
    assert main(["build", "--root", str(root), "--fit", str(held_out_bag)]) == 2
    assert "never fit" in capsys.readouterr().err
    assert main(["build", "--root", str(root), "--fit", str(tmp_path / "missing")]) == 2
    assert "no bag at" in capsys.readouterr().err
