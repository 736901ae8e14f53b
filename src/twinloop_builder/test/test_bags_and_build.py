"""Identification bags read back (twinloop_builder.recording) and the next twin version
written from them (twinloop_builder.build, the `twinloop build build` command).

Plumbing, on one short in-process session (5 s of joint excitation on the true physics);
the accuracy of identification is tested in test_identification.py and measured on long
recordings by bench/identification.py.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import numpy as np
import yaml

from twinloop_builder.build import REPORT_FILE, build_identified_twin, physics_with
from twinloop_builder.recording import MissingTopic, TooShort, WrongJointNames, WrongSplit, load_recording
from twinloop_builder.synthetic import simulate_session, write_bag
from twinloop_twin.bundle import load_twin_version
from twinloop_twin.nominal import build_nominal_twin, load_scene
from twinloop_twin.scene import acting_command_delay, command_delay_of


@pytest.fixture(scope="module")
def short_session(workcell, truth, excitation):
    return simulate_session(workcell, truth, [excitation(5.0, 11)], name="short", seed=6)


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


def test_build_writes_an_identified_twin_version(tmp_path, short_session):
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
    # here (the full fits test accuracy); it is a measured value, not the prior
    assert kp.mean != 2000.0 and "interval" in kp.note
    untouched = twin.parameters["joint.panda_joint5.damping"]
    assert not untouched.identifiable and untouched.mean == load_twin_version(root, "emulated", 0).parameters[
        "joint.panda_joint5.damping"].mean
    model = load_scene(twin)  # the scene carries the identified values
    assert model.actuator_gainprm[model.actuator("panda_joint2").id, 0] == pytest.approx(kp.mean, rel=1e-5)  # XML digits
    assert command_delay_of(model.actuator_delay[0]) == pytest.approx(
        acting_command_delay(twin.parameters["command.delay_s"].mean))
    # the middle of the whole step that acts (identification tells the step, not where in it)
    assert twin.parameters["command.delay_s"].mean * 1e3 % 1.0 == pytest.approx(0.5)
    report = yaml.safe_load(twin.file_path(REPORT_FILE).read_text())
    assert report["held_out"]["joint_rmse_after_rad"] < report["held_out"]["joint_rmse_before_rad"]
    assert stages[0][0] == "reading" and stages[-1] == ("done", 1.0)
    assert math.isfinite(built.result.held_out_rmse_after_rad)


def test_a_reported_delay_is_written_as_the_step_it_acts_as():
    """Identification reports a delay as its step's middle (k - 1/2 ms): the physics file
    the version's scene is built from gets k, odd steps too (round() gave k - 1 for odd k:
    8.5 ms -> 8), and one step at least (0.5 ms -> 1)."""
    for reported_ms, written_ms in ((7.5, 8.0), (8.5, 9.0), (10.5, 11.0), (0.5, 1.0), (40.0, 40.0)):
        raw = physics_with({"joints": {}, "command_delay_ms": 1.0}, {"command.delay_s": reported_ms / 1000.0})
        assert raw["command_delay_ms"] == pytest.approx(written_ms), (reported_ms, raw["command_delay_ms"])


def test_cli_refuses_a_held_out_bag_as_fit_data(tmp_path, short_session, capsys):
    from twinloop_builder.cli import main
    root = tmp_path / "twins"
    build_nominal_twin(root, "emulated")
    held_out_bag = write_bag(short_session, tmp_path / "held", split="held_out")
    assert main(["build", "--root", str(root), "--fit", str(held_out_bag)]) == 2
    assert "never fit" in capsys.readouterr().err
    assert main(["build", "--root", str(root), "--fit", str(tmp_path / "missing")]) == 2
    assert "no bag at" in capsys.readouterr().err


def test_stages_planned_from_the_data_and_the_cli_prints_overall_progress_and_eta(tmp_path, short_session, capsys):
    import re

    from twinloop_builder.cli import main
    from twinloop_builder.identification import IdentificationSettings, planned_stages
    fit = load_recording(write_bag(short_session, tmp_path / "fit_bag"), expected_split="fit")
    held = load_recording(write_bag(short_session, tmp_path / "held_bag", split="held_out"))
    assert planned_stages([fit], [held]) == ("reading", "arm_delay", "arm", "held_out", "residual", "writing", "done")
    assert planned_stages([fit], select=["actuator.panda_joint2"]) == ("reading", "arm", "writing", "done")
    assert planned_stages([fit], select=["command"]) == ("reading", "arm_delay", "writing", "done")
    assert planned_stages([fit], [held], settings=IdentificationSettings(residual="off"))[-3:] == (
        "held_out", "writing", "done")

    root = tmp_path / "twins"
    build_nominal_twin(root, "emulated")
    capsys.readouterr()
    assert main(["build", "--root", str(root), "--fit", fit.path, "--held-out", held.path,
                 "--select", "actuator.panda_joint2", "command"]) == 0
    lines = capsys.readouterr().err.splitlines()
    parsed = [re.fullmatch(r"\[\s*([0-9.]+) s\]\s+([0-9.]+) % overall, ETA (--|\d+ s|\d+:\d\d) \|\s+([0-9.]+) % "
                           r"(\w+): .+", line) for line in lines]
    assert all(parsed), lines
    overall = [float(m.group(2)) for m in parsed]
    stages = [m.group(5) for m in parsed]
    assert overall == sorted(overall) and overall[0] == 0.0 and overall[-1] == 100.0 > overall[-2]
    assert stages[0] == "reading" and stages[-1] == "done"
    assert {"arm_delay", "arm", "held_out", "writing"} <= set(stages)
    # the arm stages are most of it: the overall figure is past the middle when held_out starts
    assert overall[stages.index("held_out")] > 80.0
    etas = [m.group(3) for m in parsed if m.group(5) in ("arm", "held_out")]
    assert etas and all(eta != "--" for eta in etas)
