"""Physics identification (twinloop_builder.identification) against known truth, without DDS.

Data: sessions simulated in-process by twinloop_builder.synthetic (the emulated workcell's
own simulation class on a truth file, with that file's sensor noise, stepped and sampled as
the node does; no DDS jitter). Recordings are short (3 s of joint excitation: 1 s ramps
around 1 s at full amplitude) to keep the suite fast; the issue's goals still hold on them
(tolerances at each assertion). bench/identification.py measures the same on 30-120 s; the
end-to-end path over DDS and the recorder is test/test_builder_node.py.
"""
from __future__ import annotations

import mujoco
import mujoco.rollout as mj_rollout
import numpy as np
import pytest

from twinloop_builder import identification as ident
from twinloop_builder.excitation import (JointExcitationConfig, WorkspaceChecker, box_excitation, joint_excitation,
                                         load_excitation_config, motion_limits)
from twinloop_builder.identification.data import column_weights, make_segment, push_windows
from twinloop_builder.identification.fit import BlockedRollout, Stage, fit_least_squares
from twinloop_builder.identification.model import FitVariable, base_model, mimic_leaders, prismatic_joints
from twinloop_builder.recording import RecordedMotion
from twinloop_builder.synthetic import simulate_session
from twinloop_twin.nominal import physics_parameters
from twinloop_twin.physics import ARM_JOINTS, load_physics
from twinloop_twin.scene import acting_command_delay
from twinloop_twin.truth_draw import draw_truth
from twinloop_twin.workcell import default_config_dir

FIT_S = 3.0  # s of joint excitation in the fit sessions (the benchmark scales 30/60/120 s)
HELD_OUT_S = 3.0
# Goals of the issue: gains, damping, mass within 5 %; delay within 1 ms; held-out RMSE
# ratio <= 0.3. Friction loss and armature are checked against their intervals only.
GOAL = {"kp": 0.05, "kv": 0.05, "damping": 0.05, "mass_kg": 0.05}
# The intervals are calibrated (bench/uncertainty_calibration.py: 91 % of 216 truths inside
# their 95 % intervals, z RMS 1.18 over six drawn truths, 10 s recordings), so truths lie
# outside by chance: ~2 of 36 at 95 %, more on these 3 s recordings, whose errors are
# correlated within a joint (seen: 7 and 3 of 36, 5 of the 7 joint 6's gains and friction
# together, |z| <= 3.6). At most MAX_OUTSIDE of 36, none beyond MAX_Z standard deviations.
MAX_OUTSIDE = 9
MAX_Z = 6.0


def identify_truth(truth_file, workcell, nominal, spec, excitation):
    truth = load_physics(default_config_dir() / truth_file)
    fit = simulate_session(workcell, truth, [excitation(FIT_S, 0)], name="fit", seed=1)
    held = simulate_session(workcell, truth, [excitation(HELD_OUT_S, 7)], name="held", split="held_out", seed=2)
    result = ident.identify(spec, physics_parameters(nominal, source="nominal").means(), [fit], held_out=[held],
                            settings=ident.IdentificationSettings(min_duration_s=FIT_S))
    return physics_parameters(truth, source="truth").means(), result


@pytest.fixture(scope="module")
def truth_a(workcell, nominal, spec, excitation):
    return identify_truth("emulated_truth.yaml", workcell, nominal, spec, excitation)


@pytest.fixture(scope="module")
def truth_b(workcell, nominal, spec, excitation):
    return identify_truth("emulated_truth_slow.yaml", workcell, nominal, spec, excitation)


def check_recovery(truth, result):
    checked, outside = 0, []
    problems = []
    for name, estimate in result.estimates.items():
        if not estimate.identifiable:
            continue
        checked += 1
        value = truth[name]
        z = (estimate.mean - value) / estimate.std
        if not estimate.ci_low <= value <= estimate.ci_high:
            outside.append(f"{name}: truth {value:.5g} outside [{estimate.ci_low:.5g}, {estimate.ci_high:.5g}] (z {z:+.1f})")
        if abs(z) > MAX_Z:
            problems.append(f"{name}: {estimate.mean:.5g} +- {estimate.std:.3g}, truth {value:.5g}: z {z:+.1f}")
        quantity = name.split(".")[-1]
        if quantity in GOAL and abs(estimate.mean / value - 1) > GOAL[quantity]:
            problems.append(f"{name}: {estimate.mean:.5g} vs truth {value:.5g} ({estimate.mean / value - 1:+.1%})")
    delay = result.estimates["command.delay_s"]
    assert delay.identifiable
    assert abs(delay.mean - truth["command.delay_s"]) <= 0.001, delay  # <= 1 ms
    # the whole step that acts is the truth's exactly (reported: that step's middle)
    assert acting_command_delay(delay.mean) == pytest.approx(acting_command_delay(truth["command.delay_s"])), delay
    assert not problems, "\n".join(problems)
    print(f"{len(outside)} of {checked} truths outside their 95 % interval" + "".join(f"\n  {o}" for o in outside))
    assert len(outside) <= MAX_OUTSIDE, "\n".join(outside)
    # every arm gain is identified from this excitation (they carry the efforts)
    assert all(result.estimates[f"actuator.{j}.kp"].identifiable for j in ARM_JOINTS)
    # Seen on 3 s (both truth files): all 36 arm parameters and the delay identifiable, errors
    # <= 3 %; on 8 s the same; 25 leaves room for a parameter near the 10 % std threshold.
    assert checked >= 25, f"only {checked} parameters identifiable"
    ratio = result.held_out_rmse_after_rad / result.held_out_rmse_before_rad
    print(f"held-out joint RMSE {result.held_out_rmse_before_rad * 1e3:.3f} -> "
          f"{result.held_out_rmse_after_rad * 1e3:.4f} mrad (ratio {ratio:.3f}); {checked} identifiable")
    assert ratio <= 0.3


def test_default_truth_is_recovered(truth_a):
    check_recovery(*truth_a)


def test_second_truth_is_recovered_equally_well(truth_b):
    check_recovery(*truth_b)


def test_an_unexcited_gripper_is_flagged_with_both_fingers(truth_a):
    _, result = truth_a
    for quantity in ("friction_loss", "damping", "armature"):
        for joint in ("panda_finger_joint1", "panda_finger_joint2"):
            assert not result.estimates[f"joint.{joint}.{quantity}"].identifiable
    assert "never moved" in result.estimates["actuator.panda_finger_joint1.kp"].note


# A drawn truth whose two fingers differ (friction, damping, armature), as real ones do.
FINGER_TRUTH_SEED = 2
FINGER_S = 6.0  # s of excitation: the gripper's band starts at 0.1 Hz
FINGER_PREFIXES = ("actuator.panda_finger_joint1", "joint.panda_finger_joint")


def test_an_excited_gripper_gain_is_recovered_with_each_finger_fit_on_its_own(workcell, nominal, spec, amplitude):
    """Finger 2 follows finger 1 through a soft equality. With one multiplier for both
    fingers' friction, damping and armature, the pair's mismatch went into finger 1's gain:
    kp 1518 +- 26 for a true 1652 on this truth (5 std off). Each finger on its own: within
    3 std and 5 %. The arm and the delay are given the truth's values, so only the gripper's
    parameters are fit. Each finger's friction, damping and armature are fit on their own
    and flagged: the recordings tell mostly their sum."""
    truth = draw_truth(nominal, FINGER_TRUTH_SEED)
    fingers = {j: truth.joints[j] for j in ("panda_finger_joint1", "panda_finger_joint2")}
    print(f"truth: draw_truth(nominal, {FINGER_TRUTH_SEED}); fingers {fingers}")
    assert fingers["panda_finger_joint1"].friction_loss != fingers["panda_finger_joint2"].friction_loss
    config = JointExcitationConfig(duration_s=FINGER_S, ramp_s=1.0, seed=0,
                                   amplitude=dict(amplitude, panda_finger_joint1=0.02))
    trajectory = joint_excitation(config, workcell.home_joint_positions, spec.compile(), workcell.urdf_xml,
                                  workcell.table_top_height_m)
    fit = simulate_session(workcell, truth, [trajectory], name="fit", seed=1)
    values = physics_parameters(truth, source="truth").means()
    nominal_values = physics_parameters(nominal, source="nominal").means()
    prior = {n: (nominal_values[n] if n.startswith(FINGER_PREFIXES) else v) for n, v in values.items()}
    result = ident.identify(spec, prior, [fit], select=FINGER_PREFIXES,
                            settings=ident.IdentificationSettings(min_duration_s=FINGER_S))
    gain = result.estimates["actuator.panda_finger_joint1.kp"]
    true_gain = values["actuator.panda_finger_joint1.kp"]
    print(f"finger gain {gain.mean:.1f} +- {gain.std:.1f} N/m, truth {true_gain:.1f}")
    assert gain.identifiable, gain
    assert abs(gain.mean - true_gain) <= 3 * gain.std, gain
    assert abs(gain.mean / true_gain - 1) <= 0.05, gain
    # each finger's friction, damping and armature fit on its own, none claimed identifiable
    for joint in ("panda_finger_joint1", "panda_finger_joint2"):
        for quantity in ("friction_loss", "damping", "armature"):
            estimate = result.estimates[f"joint.{joint}.{quantity}"]
            assert not estimate.identifiable and "soft equality" in estimate.note, estimate


def test_joint_that_never_moves_is_flagged_not_identifiable(workcell, nominal, truth, spec, excitation):
    moving = tuple(j for j in ARM_JOINTS if j != "panda_joint4")
    fit = simulate_session(workcell, truth, [excitation(FIT_S, 3, excite=moving)], seed=4)
    assert fit.motion_range()["panda_joint4"] < 0.01  # it is held (only dragged by the others)
    prior = physics_parameters(nominal, source="nominal").means()
    # fitting joint 2 and the delay keeps this test short; joint 4 is judged before any fit
    result = ident.identify(spec, prior, [fit], select=["joint.panda_joint2", "actuator.panda_joint2", "command"],
                            settings=ident.IdentificationSettings(min_duration_s=FIT_S))
    for quantity in ("joint.panda_joint4.friction_loss", "joint.panda_joint4.damping", "joint.panda_joint4.armature",
                     "actuator.panda_joint4.kp", "actuator.panda_joint4.kv"):
        estimate = result.estimates[quantity]
        assert not estimate.identifiable, quantity
        assert estimate.mean == prior[quantity]  # no confident number: the prior stays
        assert "never moved" in estimate.note and "panda_joint4" in estimate.note
    assert any("panda_joint4 never moved" in g for g in result.guidance)
    assert result.estimates["actuator.panda_joint2.kp"].identifiable


def test_box_mass_and_friction_apart_from_pushes_and_a_lift(workcell, nominal, truth, spec):
    """The default box excitation (pushes, then a lift) on the truth file: pushes feel mass
    times friction, the held box its mass alone; both, and the finger friction, come out
    identifiable and within 5 %. (The pushes alone left mass and friction confounded,
    correlation 0.99, intervals spanning 20x.)"""
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    segments = box_excitation(config, workcell.box.size_m[0] / 2, workcell.home_joint_positions, checker,
                              max_speed=max_speed, max_acceleration=max_acceleration)
    fit = simulate_session(workcell, truth, segments, seed=5)
    assert np.linalg.norm(fit.box_pose[-1, :2] - fit.box_pose[0, :2]) > 0.05  # the box was pushed
    assert fit.box_pose[:, 2].max() - fit.box_pose[0, 2] > 0.03  # and lifted (it slips a little in the grip)
    settings = ident.IdentificationSettings()
    # one window per push and per lift, found from the box alone
    assert len(push_windows(fit, settings)) == len(config.pushes) + len(config.lifts)
    truth_values = physics_parameters(truth, source="truth").means()
    prior = dict(truth_values)  # the arm as identified (here: known); the box at its nominal values
    for name in ident.BOX_PARAMETERS:
        prior[name] = physics_parameters(nominal, source="nominal").means()[name]
    result = ident.identify(spec, prior, [fit], select=list(ident.BOX_PARAMETERS), settings=settings)
    product = result.derived["box.mass_kg*box.friction"]
    truth_values[product.name] = truth_values["box.mass_kg"] * truth_values["box.friction"]
    for name, estimate in [*((n, result.estimates[n]) for n in ident.BOX_PARAMETERS), (product.name, product)]:
        print(f"{name}: {estimate.mean:.4f} ± {estimate.std:.4f} (truth {truth_values[name]:.4f}, "
              f"{estimate.mean / truth_values[name] - 1:+.1%}), "
              f"{'identifiable' if estimate.identifiable else 'not identifiable'}")
        # the goal: identified, and within 5 %, the truth inside the interval
        # (seen: mass -0.5 %, box friction -2.0 %, finger friction +0.0 %, relative std 4-6 %)
        assert estimate.identifiable, estimate
        assert estimate.ci_low <= truth_values[name] <= estimate.ci_high, estimate
        assert abs(estimate.mean / truth_values[name] - 1) <= 0.05, estimate


def test_push_windows_ignore_tracker_jitter_and_jumps_that_come_back():
    """One push in 20 s of tracked poses at 15 Hz with 0.1 mm of jitter. Two frames stamped
    5 ms apart (their jitter alone reads as cm/s between them) and a pose that jumps 8 mm
    for two frames while the arm hides the box and comes back are not pushes (a CI run
    found a fifth window before the first push of test_builder_excite's three)."""
    rng = np.random.default_rng(3)
    t = np.arange(0.0, 20.0, 1 / 15)
    t = np.sort(np.r_[t, 4.005])  # a frame 5 ms after the one at 4.0 s
    x = 0.5 + np.clip((t - 12.0) / 0.3, 0.0, 1.0) * 0.04  # pushed 40 mm at 12.0-12.3 s
    y = 0.1 + rng.normal(0.0, 0.0001, len(t))
    x = x + rng.normal(0.0, 0.0001, len(t))
    jump = (t > 7.0) & (t < 7.15)
    y[jump] += 0.008
    pose = np.zeros((len(t), 7))
    pose[:, 0], pose[:, 1], pose[:, 3] = x, y, 1.0
    state_t = np.arange(0.0, 20.0, 0.01)
    n = len(state_t)
    motion = RecordedMotion("jitter", state_t, np.zeros((n, 9)), np.zeros((n, 9)), np.zeros((n, 9)),
                            np.zeros(0), np.zeros((0, 8)), box_t=t, box_pose=pose)
    windows = push_windows(motion, ident.IdentificationSettings())
    assert len(windows) == 1, windows
    (start, end), = windows
    assert start <= 12.0 and 12.3 <= end <= 12.3 + 0.3 + 0.8 + 0.1, windows  # speed base and margin


def test_a_slow_push_is_one_window_over_its_whole_motion():
    """A push that moves the box 60 mm over 3 s (longer than the margins' 1.2 s gap): one
    window from before its start to after its end, not one at each end."""
    t = np.arange(0.0, 20.0, 1 / 15)
    pose = np.zeros((len(t), 7))
    pose[:, 0], pose[:, 1], pose[:, 3] = 0.5 + np.clip((t - 8.0) / 3.0, 0.0, 1.0) * 0.06, 0.1, 1.0
    state_t = np.arange(0.0, 20.0, 0.01)
    n = len(state_t)
    motion = RecordedMotion("slow", state_t, np.zeros((n, 9)), np.zeros((n, 9)), np.zeros((n, 9)),
                            np.zeros(0), np.zeros((0, 8)), box_t=t, box_pose=pose)
    windows = push_windows(motion, ident.IdentificationSettings())
    assert len(windows) == 1 and windows[0][0] <= 8.0 and windows[0][1] >= 11.0, windows


def test_a_hold_is_a_stalled_finger_not_one_closing_behind_its_target():
    """The fingers close at 0.1 m/s at 3 s behind a target that moves in 4 mm steps (a
    ragged command stream: the finger lags it by more than holding_lead_m while it moves;
    a CI run found a window there), then hold a box at 12-15 s: stalled at 0.029 m, the
    target at 0.018 m. One window, the hold's."""
    state_t = np.arange(0.0, 20.0, 0.002)
    finger = np.interp(state_t, [0, 3.0, 3.15, 11.9, 12.0, 15.0, 15.2, 20], [0.04, 0.04, 0.025, 0.025, 0.029, 0.029,
                                                                             0.04, 0.04])
    command_t = np.arange(0.0, 20.0, 0.04)
    target = np.interp(command_t, [0, 2.99, 3.0, 3.1, 11.9, 12.0, 15.0, 15.2, 20], [0.04, 0.04, 0.036, 0.018, 0.025,
                                                                                     0.018, 0.018, 0.04, 0.04])
    target = np.round(target / 0.004) * 0.004  # in steps
    position, command = np.zeros((len(state_t), 9)), np.zeros((len(command_t), 8))
    position[:, 7] = position[:, 8] = finger
    velocity = np.gradient(position, state_t, axis=0)
    command[:, 7] = target
    motion = RecordedMotion("fingers", state_t, position, velocity, np.zeros_like(position), command_t, command)
    settings = ident.IdentificationSettings()
    lag = position[:, 7] - motion.commands_on_grid(state_t)[:, 7]
    assert lag[(state_t > 3.0) & (state_t < 3.2)].max() > settings.holding_lead_m  # the case: lagging, not holding
    windows = push_windows(motion, settings)
    assert len(windows) == 1 and windows[0][0] < 12.0 < 15.0 < windows[0][1] < 16.0, windows


# ----------------------------------------------------------------------------- the stages' pieces

def test_mimic_and_prismatic_joints_come_from_the_scene(spec):
    model = spec.compile()
    assert mimic_leaders(model) == {"panda_finger_joint2": "panda_finger_joint1"}
    assert prismatic_joints(model) == {"panda_finger_joint1", "panda_finger_joint2"}


@pytest.fixture(scope="module")
def short_fit(workcell, truth, excitation):
    return simulate_session(workcell, truth, [excitation(2.5, 0)], name="fit", seed=1)


def test_blocked_rollout_equals_one_plain_rollout(spec, short_fit):
    """Blocks of 100 steps on one kept thread pool give exactly what one mujoco.rollout gives."""
    model = base_model(spec, contacts=False)
    segment = make_segment(model, short_fit, short_fit.state_t[0], short_fit.state_t[-1],
                           column_weights(ident.IdentificationSettings(), box=False))
    datas = [mujoco.MjData(model) for _ in range(2)]
    blocked = BlockedRollout(block_steps=100)
    try:
        got = blocked(models=[model, model], datas=datas, control_signal=[segment.control] * 2,
                      initial_states=[segment.initial_state] * 2)
    finally:
        blocked.close()
    state, sensors = mj_rollout.rollout(model, mujoco.MjData(model), segment.initial_state,
                                        segment.control.data[:-1])
    qpos = 1 + model.jnt_qposadr[[model.joint(j).id for j in ("panda_joint1", "panda_joint7")]]
    for trajectory in got:
        data = trajectory.sensordata.data
        # Each block starts the constraint solver without the previous step's warm start:
        # differences of ~1e-10 rad and ~4e-5 N m, far below the sensors' noise.
        np.testing.assert_allclose(data[:, [0, 6]], state[0][:, qpos], rtol=0, atol=1e-8)  # positions after each step
        np.testing.assert_allclose(data[:, 9:18], sensors[0][:, 9:18], rtol=0, atol=1e-4)  # efforts (noise 0.1 N m)
        assert np.ptp(data[:, 0]) > 0.1  # and the arm did move


def test_fit_stops_once_a_step_moves_it_by_less_than_a_tenth_of_a_sigma(spec, truth, short_fit):
    """Joint 2's gains from 30 % off (everything else at the truth): the early stop lands
    where the optimizer's own termination lands, within 0.1 sigma, with fewer rollouts. (On
    the 8 s sessions of the former tests, the optimizer ended only after ~140 failed steps
    at the optimum: 180 residual evaluations of a 6-variable stage instead of 32.)"""
    values = physics_parameters(truth, source="truth").means()
    names = ("actuator.panda_joint2.kp", "actuator.panda_joint2.kv")
    variables = [FitVariable(n, (n,), (values[n] * 1.3,)) for n in names]
    fixed = {n: v for n, v in values.items() if n not in names}
    model = base_model(spec, contacts=False)
    weights = column_weights(ident.IdentificationSettings(), box=False)
    segments = [make_segment(model, short_fit, short_fit.state_t[0], short_fit.state_t[-1], weights)]
    fits = {}
    for label, sigma in (("early", 0.1), ("to the end", 0.0)):
        # MuJoCo's own regularizer factor, with which the optimizer's ending costs the most
        settings = ident.IdentificationSettings(converged_step_sigma=sigma, max_iterations=30, lm_mu_factor=10 ** 0.1)
        stage = Stage("joint 2", spec, model, variables, fixed, segments, settings)
        fits[label] = fit_least_squares(stage, np.zeros(len(names)), settings, lambda *_: None, lambda: False)
    early, end = fits["early"], fits["to the end"]
    std = np.sqrt(np.diag(end.covariance))  # the reported standard deviations
    print(f"early: {early.report.residual_evaluations} evaluations, to the end: {end.report.residual_evaluations}; "
          f"difference {np.round(np.abs(early.x - end.x) / std, 3)} sigma")
    assert np.all(np.abs(early.x - end.x) <= 0.1 * std), (early.x, end.x, std)
    assert early.report.residual_evaluations < end.report.residual_evaluations
    for x, variable in zip(early.x, variables):  # and it found the truth (within 2 %)
        assert abs(variable.physical(x)[variable.name] / values[variable.name] - 1) < 0.02


def test_box_poses_with_a_repeated_stamp_do_not_make_a_push(short_fit):
    """A tracker that stamps two poses with the same camera time (tracker noise between
    them: 0.2 mm) must not turn a joint excitation, where the box stays put, into a push
    (the quick loop once identified no arm parameter after that)."""
    import dataclasses

    settings = ident.IdentificationSettings()
    assert len(short_fit.box_t) >= 3 and len(push_windows(short_fit, settings)) == 0
    index = len(short_fit.box_t) // 2
    box_t = np.insert(short_fit.box_t, index, short_fit.box_t[index])
    box_pose = np.insert(short_fit.box_pose, index, short_fit.box_pose[index] + [2e-4, 0, 0, 0, 0, 0, 0], axis=0)
    repeated = dataclasses.replace(short_fit, box_t=box_t, box_pose=box_pose)
    assert len(push_windows(repeated, settings)) == 0
