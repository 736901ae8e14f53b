"""The loop on the emulated cell with all four variation modes, measured in one run:
`twinloop loop --modes nominal,posterior,wide,oracle` (the scanned geometry v1, identify v2
on it from recordings, train a carry policy per mode, held-out trials of each on the cell
scored against v2, compare, fit trials, the correction into v3 and the same trials scored
against v3), then the numbers issue 16 sets goals for, read from the run's reports.

Prints per mode: real success and its 95 % interval, its ratio to the oracle-trained
policy's, the identified twin's (and the corrected one's) predicted success, the staleness
verdict; Pearson r and MMRV of both twins' predictions over the modes (the loop prints them; `twinloop validate
compare`); the wall time of each stage. Goals: posterior >= 0.95 x oracle, nominal <= 0.6 x
oracle, r >= 0.9.

    .venv/bin/python bench/validation_loop.py [--trials 10] [--truth-file F | --seed N] [--quick]

Not a test: about 39 minutes with the defaults on 2 cores (four trainings, 40 held-out and
8 fit trials; more when a correction runs).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from twinloop_ros.process import fresh_domain_id, localhost_env
from twinloop_twin.workcell import default_config_dir

TWINLOOP = str(Path(sys.executable).parent / "twinloop")
MODES = ("nominal", "posterior", "wide", "oracle")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10, help="held-out trials per mode")
    parser.add_argument("--truth-file", default=str(default_config_dir() / "emulated_truth.yaml"))
    parser.add_argument("--seed", type=int, default=None, help="draw the truth (twinloop_twin.truth_draw) instead")
    parser.add_argument("--quick", action="store_true", help="the loop's quick setting (short recordings, training)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="validation-loop-"))
    truth = Path(args.truth_file).resolve()
    if args.seed is not None:
        from twinloop_twin.physics import load_physics
        from twinloop_twin.truth_draw import describe, draw_truth, truth_yaml
        nominal = load_physics(default_config_dir() / "nominal_physics.yaml")
        drawn = draw_truth(nominal, args.seed)
        truth = work / f"truth_seed{args.seed}.yaml"
        truth.write_text(truth_yaml(drawn, seed=args.seed))
        print(describe(drawn, nominal))
    run_dir = work / "run"
    started = time.monotonic()
    done = subprocess.run([TWINLOOP, "loop", "--modes", ",".join(MODES), "--trials", str(args.trials),
                           "--truth-file", str(truth), "--run-dir", str(run_dir), *(["--quick"] if args.quick else [])],
                          env=localhost_env(fresh_domain_id()), stdout=subprocess.PIPE, text=True)
    wall = time.monotonic() - started
    print(done.stdout)
    if done.returncode != 0:
        print(f"twinloop loop exit {done.returncode}")
        return 1
    reports = {m: json.loads((run_dir / "validation" / f"carry_{m}" / "report.json").read_text()) for m in MODES}
    oracle = reports["oracle"]["summary"]["real_rate"]
    print(f"truth {truth}; {args.trials} held-out trials per mode; {'quick' if args.quick else 'default'} setting; "
          f"the loop's wall time {wall / 60:.1f} min")
    identified = reports["oracle"]["twin"].rsplit("/v", 1)[1]  # the version the rounds scored against
    then = int(identified) + 1
    corrected = {m: run_dir / "validation" / f"carry_{m}-v{then}" / "report.json" for m in MODES}
    print(f"mode       real success (95 % CI)       / oracle   v{identified} predicts   v{then} predicts   "
          f"v{identified} staleness")
    for mode, report in reports.items():
        s = report["summary"]
        ratio = s["real_rate"] / oracle if oracle > 0 else float("nan")
        z = s["staleness"]["median_z"]
        again = json.loads(corrected[mode].read_text())["summary"] if corrected[mode].is_file() else None
        print(f"{mode:10s} {s['real_successes']:2d}/{s['trials']} {s['real_rate']:4.0%} "
              f"({s['real_interval'][0]:.0%}-{s['real_interval'][1]:.0%})   x{ratio:4.2f}    "
              f"{s['twin_successes']:2d}/{s['trials']} {s['twin_rate']:4.0%} (draws {_rate(s)})    "
              + (f"{again['twin_successes']:2d}/{again['trials']} {again['twin_rate']:4.0%} (draws {_rate(again)})    "
                 if again else "  -           ")
              + f"{'-' if z is None else f'median z {z:.2f}'}; failure modes "
              + ", ".join(f"{k} {v}" for k, v in s["failure_modes"].items() if v))
    print(f"run folder (bags, twins, policies, validation pages): {run_dir}")
    return 0


def _rate(summary: dict) -> str:
    """The round's success rate over the twin's posterior draws ('-': scored without draws)."""
    value = summary.get("twin_posterior_rate")
    return "-" if value is None or value != value else f"{value:.0%}"


if __name__ == "__main__":
    sys.exit(main())
