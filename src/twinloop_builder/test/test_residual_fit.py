"""The residual stage (twinloop_builder.residual_fit) and the residual a twin version carries
(twinloop_twin.residual), on truths with and without unmodelled effects.

The twin here is the truth's own physics without its effects (identification done
perfectly), so what is left is exactly what no parameter expresses; the whole build with
identification is measured by bench/residual_model.py and tested over bags in
test_bags_and_build.py.
"""
from __future__ import annotations

import dataclasses

import mujoco
import numpy as np
import pytest

from twinloop_builder.residual_fit import TwinModel, fit_residual, noise_floor, replay_errors, rmse
from twinloop_builder.synthetic import simulate_session
from twinloop_sim.workcell_sim import NO_NOISE, WorkcellSimulation
from twinloop_twin.physics import ARM_JOINTS, Backlash, Payload, Stribeck, UnmodelledEffects
from twinloop_twin.residual import ResidualError, ResidualTorque, ResidualWeights
from twinloop_twin.scene import compile_workcell
from twinloop_twin.truth_draw import describe, draw_truth

EFFECTS = UnmodelledEffects(Stribeck(1.8, 0.05), Backlash("panda_joint4", 0.002), Payload(0.4, (0.0, 0.0, 0.08)))


@pytest.fixture(scope="module")
def drawn(nominal):
    truth = draw_truth(nominal, 5)
    print(describe(truth, nominal).splitlines()[0])
    return truth


@pytest.fixture(scope="module")
def sessions(workcell, drawn, excitation):
    """(fit, held-out) recordings of the drawn truth with the effects; 10 s and 6 s."""
    truth = dataclasses.replace(drawn, unmodelled=EFFECTS)
    return (simulate_session(workcell, truth, [excitation(10.0, 0)], name="fit", seed=100),
            simulate_session(workcell, truth, [excitation(6.0, 1)], name="held", split="held_out", seed=200))


def test_the_noise_floor_is_estimated_from_the_recordings(sessions, drawn):
    estimate = noise_floor([sessions[0]])
    print(f"noise floor {estimate * 1e3:.4f} mrad, true {drawn.noise.joint_position_std_rad * 1e3:.4f}")
    assert estimate == pytest.approx(drawn.noise.joint_position_std_rad, rel=0.1)


def test_a_residual_learns_what_the_physics_cannot_express(workcell, drawn, sessions):
    """Held-out error of the twin without the effects, without and with the residual: the
    residual must take at least half of it away (measured: see the print) and stay kept."""
    fit, held = sessions
    model = compile_workcell(workcell, drawn)  # the truth's parameters, not its effects
    outcome = fit_residual(model, [fit], [held])
    print(outcome.reason, outcome.report()["held_out_rmse_mrad"])
    assert outcome.weights is not None
    assert outcome.held_out_before_rad > 5 * drawn.noise.joint_position_std_rad  # the effects matter
    assert outcome.held_out_after_rad < 0.5 * outcome.held_out_before_rad
    # the report's numbers are the replays' own
    twin = TwinModel(model)
    assert rmse([replay_errors(twin, held, ResidualTorque(model, outcome.weights))])[0] == pytest.approx(
        outcome.held_out_after_rad, rel=1e-9)


def test_no_residual_where_the_twin_has_no_systematic_error(workcell, drawn, excitation):
    fit = simulate_session(workcell, drawn, [excitation(8.0, 0)], name="fit", seed=100)
    outcome = fit_residual(compile_workcell(workcell, drawn), [fit])
    print(outcome.reason)
    assert outcome.weights is None and "no systematic error" in outcome.reason
    assert outcome.validation_before_rad < 2 * drawn.noise.joint_position_std_rad
    assert fit_residual(compile_workcell(workcell, drawn), [fit], mode="off").reason == "residual: off in the settings"


def _constant_wrench(force_n, mask=np.ones(7)) -> ResidualWeights:
    """A residual whose wrench part is a constant world force at the hand (biases only)."""
    hidden = 4
    zeros = (np.zeros((hidden, 9)), np.zeros(hidden), np.zeros((hidden, hidden)), np.zeros(hidden),
             np.zeros((6, hidden)), np.array([*force_n, 0.0, 0.0, 0.0]))
    joint = (np.zeros((hidden, 9)), np.zeros(hidden), np.zeros((hidden, hidden)), np.zeros(hidden),
             np.zeros((1, hidden)), np.zeros(1))
    return ResidualWeights(zeros, joint, np.ones(7), np.ones(7), np.asarray(mask, dtype=float))


def test_a_residual_is_applied_as_its_torques_before_every_step(workcell, truth):
    """A constant 20 N downward force at the hand sags each joint by J^T F / kp at rest
    (within the joint's friction band), as a payload would; a masked joint feels none."""
    force = np.array([0.0, 0.0, -20.0])
    plain = WorkcellSimulation(workcell, truth, noise=NO_NOISE)
    plain.step_until(2.0)
    model = compile_workcell(workcell, truth)
    loaded = WorkcellSimulation(workcell, model=model, residual=ResidualTorque(model, _constant_wrench(force)))
    loaded.step_until(2.0)
    jacobian = np.zeros((3, model.nv))
    mujoco.mj_jacBody(model, loaded.data, jacobian, None, model.body("panda_hand").id)
    for index, joint in enumerate(ARM_JOINTS):
        dof = int(model.jnt_dofadr[model.joint(joint).id])
        expected = float(jacobian[:, dof] @ force) / truth.joints[joint].kp
        sag = loaded.true_joint_positions()[joint] - plain.true_joint_positions()[joint]
        assert abs(sag - expected) <= 2 * truth.joints[joint].friction_loss / truth.joints[joint].kp + 0.05 * abs(
            expected) + 1e-5, joint
    masked = WorkcellSimulation(workcell, model=model,
                                residual=ResidualTorque(model, _constant_wrench(force, [1, 0, 1, 1, 1, 1, 1])))
    masked.step_until(2.0)
    assert masked.true_joint_positions()["panda_joint2"] == pytest.approx(plain.true_joint_positions()["panda_joint2"],
                                                                          abs=2 * 0.4 / truth.joints["panda_joint2"].kp)


def test_residual_files_round_trip_and_bad_ones_are_refused(tmp_path):
    weights = _constant_wrench([1.0, 2.0, 3.0])
    path = tmp_path / "residual.npz"
    weights.save(path)
    again = ResidualWeights.load(path)
    for a, b in zip(weights.wrench + weights.joint, again.wrench + again.joint):
        np.testing.assert_array_equal(a, b)
    (tmp_path / "bad.npz").write_bytes(b"not a residual")
    with pytest.raises(ResidualError, match="not a readable residual"):
        ResidualWeights.load(tmp_path / "bad.npz")
    broken = dataclasses.replace(weights, mask=np.array([np.nan] * 7))
    broken.save(tmp_path / "nan.npz")
    with pytest.raises(ResidualError, match="NaN"):
        ResidualWeights.load(tmp_path / "nan.npz")


def test_a_build_on_a_cell_with_effects_carries_its_residual_into_replay(tmp_path, workcell, truth, excitation,
                                                                          capsys):
    """`twinloop build build` on bags of the cell with effects: the version gets residual.npz
    and its report, and replaying the held-out bag in it (twinloop replay's path) uses it.
    On the shipped truth: on drawn truth 5 with the same effects identification itself went
    astray (held-out 8.4 mrad after it), which no residual of this size takes back."""
    import yaml

    from twinloop_builder.build import REPORT_FILE
    from twinloop_builder.cli import main
    from twinloop_builder.synthetic import write_bag
    from twinloop_sim.replay import load_recorded_run, replay, replay_bag
    from twinloop_twin.bundle import load_twin_version
    from twinloop_twin.kinematics import UrdfTransforms
    from twinloop_twin.nominal import build_nominal_twin, load_scene, load_twin_workcell
    from twinloop_twin.residual import RESIDUAL_FILE

    with_effects = dataclasses.replace(truth, unmodelled=EFFECTS)
    fit = simulate_session(workcell, with_effects, [excitation(10.0, 0)], name="fit", seed=100)
    held = simulate_session(workcell, with_effects, [excitation(6.0, 1)], name="held", split="held_out", seed=200)
    root = tmp_path / "twins"
    build_nominal_twin(root, "emulated")
    fit_bag = write_bag(fit, tmp_path / "fit_bag")
    held_bag = write_bag(held, tmp_path / "held_bag", split="held_out")
    assert main(["build", "--root", str(root), "--fit", str(fit_bag), "--held-out", str(held_bag)]) == 0
    printed = capsys.readouterr().out
    print(printed)
    assert "residual: kept" in printed
    twin = load_twin_version(root, "emulated")
    assert twin.file_path(RESIDUAL_FILE).is_file()
    report = yaml.safe_load(twin.file_path(REPORT_FILE).read_text())["residual"]
    assert report["applied"] and report["held_out_rmse_mrad"]["with"] < report["held_out_rmse_mrad"]["without"]
    with_residual, _ = replay_bag(held_bag, twin.path)
    workcell = load_twin_workcell(twin)
    plain_sim = WorkcellSimulation(workcell, model=load_scene(twin))
    plain = replay(load_recorded_run(held_bag, list(plain_sim.commandable_joints)), plain_sim,
                   UrdfTransforms(workcell.urdf_xml))
    arm = slice(0, 7)
    before, after = float(np.mean(plain.joint_rmse_rad[arm])), float(np.mean(with_residual.joint_rmse_rad[arm]))
    print(f"replay of the held-out bag, mean arm joint RMSE: {before * 1e3:.3f} -> {after * 1e3:.3f} mrad")
    assert after < 0.7 * before
