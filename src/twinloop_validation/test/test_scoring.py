"""The scoring's pure parts on hand-built values: failure modes, the command-to-motion
latency of a known delay, a round's summary. Whole trials (bags recorded through the
runner, replayed in a twin) are scored in test/test_cli_live.py::test_validate_run."""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from twinloop_validation import cli
from twinloop_validation.cli import main
from twinloop_validation.scoring import (FAILURE_MODES, STALE_Z, BoxGoal, TrialScore, ValidationError, classify,
                                         command_latency_s, compare_rounds, format_summary, staleness_verdict,
                                         summarize)

GOAL = BoxGoal((0.45, -0.05), 0.015)
START = np.array([0.45, 0.10, 0.775])  # 15 cm from the goal along -y


@pytest.mark.parametrize("end, lift, faulted, mode", [
    ((0.455, -0.045), 0.05, False, "success"),  # 7 mm from the goal
    ((0.455, -0.045), 0.05, True, "fault"),  # the monitor's fault wins
    ((0.451, 0.095), 0.002, False, "miss"),  # never lifted, moved 5 mm
    ((0.451, 0.095), 0.03, False, "slip"),  # lifted, dropped where it was
    ((0.45, 0.02), 0.05, False, "slip"),  # dropped 7 cm short
    ((0.45, -0.09), 0.05, False, "overshoot"),  # 4 cm beyond
    ((0.50, -0.05), 0.05, False, "off_target"),  # 5 cm beside
])
def test_failure_modes_on_hand_built_ends(end, lift, faulted, mode):
    assert classify(GOAL, START, np.array([*end, 0.775]), lift, faulted) == mode


def test_latency_of_a_known_delay():
    """A first-order lag behind a minimum-jerk-like command: the shift found is the dead time
    plus the lag's time constant (what a user sees), here 30 ms + 20 ms, to 4 ms."""
    dt = 0.002
    t = np.arange(0.0, 3.0, dt)
    command = np.stack([0.3 * np.sin(2.0 * t), 0.2 * np.cos(1.3 * t)], axis=1)
    delayed = np.stack([np.interp(t - 0.030, t, command[:, j]) for j in range(2)], axis=1)
    measured = np.empty_like(delayed)
    measured[0] = delayed[0]
    for k in range(1, len(t)):  # first order, tau 20 ms
        measured[k] = measured[k - 1] + dt / 0.020 * (delayed[k] - measured[k - 1])
    latency = command_latency_s(t, measured, t, command)
    assert abs(latency - 0.050) <= 0.004, latency
    assert np.isnan(command_latency_s(t, measured, t[:1], command[:1]))  # no commands: nothing to measure


def _score(real: bool, twin: bool, mode: str, box_error: float, rejected: int = 0,
           draws: float = float("nan")) -> TrialScore:
    return TrialScore(bag="b", real_success=real, twin_success=twin, failure_mode=mode, box_start_xy=(0.45, 0.1),
                      real_box_end_xy=(0.45, -0.05), twin_box_end_xy=(0.45, -0.05), box_end_error_m=box_error,
                      joint_rmse_rad={"panda_joint1": 0.01, "panda_finger_joint1": 0.5}, end_effector_rmse_m=0.004,
                      command_latency_s=0.05, envelope_rejected=rejected, envelope_fault="",
                      twin_success_draws=draws)


def test_a_round_summary_counts_and_intervals():
    scores = [_score(True, True, "success", 0.002), _score(False, True, "slip", 0.09, rejected=2),
              _score(True, False, "success", 0.03), _score(True, True, "success", 0.004)]
    summary = summarize(scores)
    assert (summary.trials, summary.real_successes, summary.twin_successes) == (4, 3, 3)
    assert summary.real_rate == 0.75 and summary.agreement == 0.5
    # Wilson 95 % for 3 of 4: centre (0.75 + z²/8) / (1 + z²/4) = 0.6275, half-width 0.3269
    assert summary.real_interval == pytest.approx((0.3006, 0.9544), abs=1e-4)
    assert summary.failure_modes == {**dict.fromkeys(FAILURE_MODES, 0), "success": 3, "slip": 1}
    assert summary.box_end_error_m == pytest.approx({"median": 0.017, "max": 0.09})
    assert summary.worst_joint_rmse_rad["max"] == 0.01  # the fingers are not arm joints
    assert summary.envelope_rejected == 2
    assert math.isnan(summary.twin_posterior_rate)  # scored without posterior draws
    drawn = summarize([_score(True, True, "success", 0.002, draws=0.75), _score(False, False, "miss", 0.05, draws=0.25)])
    assert drawn.twin_posterior_rate == pytest.approx(0.5) and drawn.twin_rate == 0.5
    line = format_summary(drawn)
    assert "twin predicts 1/2 (50%, 9%-91%; 50% over its posterior draws); outcomes agree in 100%;" in line, line
    assert "posterior draws" not in format_summary(summary) and "outcomes agree in 50%;" in format_summary(summary)
    assert math.isnan(summarize([_score(True, True, "success", 0.0, draws=1.0), _score(True, True, "success", 0.0)])
                      .twin_posterior_rate)  # not every trial drawn: no rate
    with pytest.raises(ValidationError, match="no trials"):
        summarize([])


def _round(folder, policy: str, real: float, twin: float, twin_version: str = "emulated/v1"):
    folder.mkdir()
    (folder / "report.json").write_text(json.dumps(
        {"policy": policy, "twin": twin_version, "summary": {"real_rate": real, "twin_rate": twin}}))
    return folder


def test_compare_policies_pearson_and_mmrv(tmp_path, capsys):
    """Three policies: the twin ranks them as the cell does (MMRV 0) and tracks them (r from
    numpy's corrcoef); one pair swapped costs the real gap of that pair."""
    rounds = [_round(tmp_path / p, p, r, t) for p, r, t in
              (("carry_posterior@1", 0.9, 0.8), ("carry_wide@1", 0.5, 0.6), ("carry_nominal@1", 0.2, 0.1))]
    comparison = compare_rounds([json.loads((r / "report.json").read_text()) for r in rounds])
    assert comparison.mmrv == 0.0
    assert comparison.pearson_r == pytest.approx(np.corrcoef([0.9, 0.5, 0.2], [0.8, 0.6, 0.1])[0, 1], abs=1e-12)
    swapped = compare_rounds([{"policy": "a", "twin": "t", "summary": {"real_rate": 0.9, "twin_rate": 0.5}},
                              {"policy": "b", "twin": "t", "summary": {"real_rate": 0.5, "twin_rate": 0.8}}])
    assert swapped.mmrv == pytest.approx(0.4)  # each policy's worst violation is the 0.4 gap
    assert main(["compare", *map(str, rounds)]) == 0
    assert "MMRV 0.000" in capsys.readouterr().out
    # Where every round has the twin's posterior rate, the comparison is over it: a twin
    # whose mean predicts 1, 1, 1 (r undefined) and whose draws spread 0.4, 1, 1 tracks a
    # cell at 0, 1, 1; one round without it: every round's mean outcome.
    posterior = [{"policy": p, "twin": "t", "summary": {"real_rate": r, "twin_rate": 1.0, "twin_posterior_rate": d}}
                 for p, r, d in (("nominal", 0.0, 0.4), ("posterior", 1.0, 1.0), ("oracle", 1.0, 1.0))]
    drawn = compare_rounds(posterior)
    assert drawn.basis == "posterior" and drawn.twin_rates == [0.4, 1.0, 1.0]
    assert drawn.pearson_r == pytest.approx(1.0) and drawn.mmrv == 0.0
    posterior[0]["summary"]["twin_posterior_rate"] = float("nan")
    mean = compare_rounds(posterior)
    assert mean.basis == "mean" and mean.twin_rates == [1.0, 1.0, 1.0] and math.isnan(mean.pearson_r)
    # the command's JSON line is strict JSON: the undefined r is null
    constant = [_round(tmp_path / f"constant_{p}", p, r, 1.0) for p, r in (("a", 0.0), ("b", 1.0))]
    assert main(["compare", *map(str, constant)]) == 0
    numbers = json.loads(capsys.readouterr().out.splitlines()[-1], parse_constant=pytest.fail)
    assert numbers["pearson_r"] is None and numbers["twin_rates"] == [1.0, 1.0] and numbers["basis"] == "mean"
    # Rounds against two twins, one round, a folder without a report: one line, exit 2.
    other = _round(tmp_path / "other", "carry_oracle@1", 1.0, 1.0, twin_version="emulated/v2")
    malformed = tmp_path / "malformed"
    malformed.mkdir()
    (malformed / "report.json").write_text(json.dumps(
        {"policy": "p", "twin": "emulated/v1", "summary": {"real_rate": 1.0, "twin_posterior_rate": "x"}}))
    for args, message in (([rounds[0], other], "different twins"), ([rounds[0]], "at least two"),
                          ([rounds[0], tmp_path], "no readable report.json"),
                          ([rounds[0], malformed], "report.json: summary.twin_rate missing, "
                                                   "summary.twin_posterior_rate is 'x', not a number;")):
        assert main(["compare", *map(str, args)]) == 2
        err = capsys.readouterr().err
        assert message in err and err.startswith("twinloop validate compare: error: ")


def test_staleness_verdict_from_the_trials_z():
    """The round's median z against the threshold; the evidence names the worst joint."""
    def checked(z: float, observed: float) -> TrialScore:
        score = _score(True, True, "success", 0.002)
        return dataclasses.replace(score, staleness_z=z, joint_rmse_rad={"panda_joint2": observed},
                                   predicted_spread_rad={"panda_joint2": observed / z})
    current = staleness_verdict([checked(0.4, 0.0008), checked(0.9, 0.0018), checked(5.0, 0.01)])
    assert current["stale"] is False and current["median_z"] == 0.9
    stale = staleness_verdict([checked(4.0, 0.02), checked(7.0, 0.035), checked(2.0, 0.01)])
    assert stale["stale"] is True and stale["median_z"] == 4.0
    assert "35.0 mrad observed against 5.0 mrad" in stale["evidence"]
    unknown = staleness_verdict([_score(True, True, "success", 0.002)])
    assert unknown["stale"] is None and "no identified uncertainty" in unknown["evidence"]
    assert cli.STALE_Z == STALE_Z


def test_score_arguments_are_checked_before_anything_is_scored(tmp_path, capsys):
    """A bag missing among several is told at once (before the first is scored, before the
    policy or twin is read), and nothing is written; a bad option's error comes with the
    subcommand's usage line; --help gives the defaults."""
    present = tmp_path / "trial_0"
    present.mkdir()
    output = tmp_path / "round"
    args = ["score", "no_such_policy", "--twin", "no_such_twin", "--output", str(output)]
    assert main([*args, str(present), str(tmp_path / "trial_1_typo")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such trial bag" in err[0] and "trial_1_typo" in err[0] and "trial_0" not in err[0]
    assert err[0].startswith("twinloop validate score: error: ")  # the prefix of argparse's own errors below
    assert not output.exists() and present.is_dir() and not any(present.iterdir())
    for option, told in ((["--workers", "0"], "--workers 0"), (["--draws", "-1"], "--draws -1")):
        with pytest.raises(SystemExit) as exit_:
            main([*args, *option, str(present)])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "usage: twinloop validate score" in err and told in err
    with pytest.raises(SystemExit):
        main(["score", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "default 8" in help_text and f"default {STALE_Z:g}" in help_text
