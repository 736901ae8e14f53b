"""The loop on the emulated cell, measured in one run: identify a twin from recordings, train
a carry policy per variation mode, run each on the cell as held-out trials, score them
against the identified twin, and compare (twinloop_validation).

Every step is the `twinloop` command a user runs, against `twinloop bringup` (the emulated
workcell with its hidden physics, the envelope monitor, recorder, box tracker, policy
runner, ...) in a scratch folder:

1. `twinloop build excite` (joints fit, joints held-out, pushes) and `twinloop build build`:
   the identified twin v1 (its posterior).
2. `twinloop policy train carry_<mode> --mode <mode>` for nominal (the nominal twin v0),
   posterior (v1), wide and oracle (the truth file: a measurement no real cell offers).
3. `twinloop validate run carry_<mode> --twin twins/emulated/v1 -n N`: real success (box
   tracker) with its 95 % interval, and v1's predicted success (the trials replayed in v1).
4. `twinloop validate compare`: Pearson r and MMRV of v1's predictions over the modes.

Prints per mode: real success and interval, its ratio to the oracle-trained policy's,
v1's prediction; then r and MMRV; and the wall time of each step. Goals (issue 16):
posterior >= 0.95 x oracle, nominal <= 0.6 x oracle, r >= 0.9.

    .venv/bin/python bench/validation_loop.py [--trials 10] [--truth-file F | --seed N] [--quick]

`--quick` trains with the README's short setting (about 30 s a mode) instead of the task
file's (about 2 min a mode). Not a test: about 25 minutes with the defaults.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from twinloop_ros.process import fresh_domain_id, localhost_env
from twinloop_twin.workcell import default_config_dir

TWINLOOP = str(Path(sys.executable).parent / "twinloop")
MODES = ("nominal", "posterior", "wide", "oracle")
QUICK = "--contexts 2 --draws 4 --iterations 2 --episodes 16"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10, help="held-out trials per mode")
    parser.add_argument("--truth-file", default=str(default_config_dir() / "emulated_truth.yaml"))
    parser.add_argument("--seed", type=int, default=None, help="draw the truth (twinloop_twin.truth_draw) instead")
    parser.add_argument("--quick", action="store_true", help="the README's short training setting")
    parser.add_argument("--work", default="", help="scratch folder (default: a new temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="validation-loop-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    truth = Path(args.truth_file).resolve()
    if args.seed is not None:
        from twinloop_twin.physics import load_physics
        from twinloop_twin.truth_draw import describe, draw_truth, truth_yaml
        nominal = load_physics(default_config_dir() / "nominal_physics.yaml")
        drawn = draw_truth(nominal, args.seed)
        truth = work / f"truth_seed{args.seed}.yaml"
        truth.write_text(truth_yaml(drawn, seed=args.seed))
        print(describe(drawn, nominal))
    env = localhost_env(fresh_domain_id())
    timings: dict[str, float] = {}

    def run(line: str, timeout_s: float = 1800.0, key: str | None = None) -> str:
        started = time.monotonic()
        done = subprocess.run([TWINLOOP, *shlex.split(line)[1:]], cwd=work, env=env, capture_output=True, text=True,
                              timeout=timeout_s)
        timings[key or line] = time.monotonic() - started
        print(f"$ {line}  -> exit {done.returncode} in {timings[key or line]:.0f} s", flush=True)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
            raise SystemExit(f"failed: {line}")
        return done.stdout

    log = open(work / "bringup.log", "w")
    bringup = subprocess.Popen([TWINLOOP, "bringup", "--truth-file", str(truth), "--log-dir", "log/bringup"], cwd=work,
                               env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180.0
        while subprocess.run([TWINLOOP, "monitor", "status"], cwd=work, env=env, capture_output=True).returncode:
            if time.monotonic() > deadline or bringup.poll() is not None:
                raise SystemExit(f"twinloop bringup did not come up: see {work / 'bringup.log'}")
            time.sleep(2.0)
        time.sleep(5.0)  # the policy runner, tracker and builder after the monitor
        run("twinloop twin build-nominal")
        fit = run("twinloop build excite --kind joints --split fit --duration 30").strip().splitlines()[-1]
        held_out = run("twinloop build excite --kind joints --split held_out --seed 7 --duration 10").strip().splitlines()[-1]
        pushes = run("twinloop build excite --kind pushes --split fit").strip().splitlines()[-1]
        run(f"twinloop build build --fit {fit} {pushes} --held-out {held_out}", key="identification (build)")
        setting = QUICK if args.quick else ""
        for mode in MODES:
            twin = {"nominal": "--twin twins/emulated/v0", "oracle": f"--oracle-physics {truth}"}.get(
                mode, "--twin twins/emulated/v1")
            run(f"twinloop policy train carry_{mode} --mode {mode} {twin} {setting}", key=f"train {mode}")
        for mode in MODES:
            run(f"twinloop validate run carry_{mode} --twin twins/emulated/v1 -n {args.trials} "
                f"--output validation/{mode}", timeout_s=3600.0, key=f"validate {mode}")
        comparison = run("twinloop validate compare " + " ".join(f"validation/{m}" for m in MODES), key="compare")
    finally:
        os.killpg(bringup.pid, signal.SIGINT)
        try:
            bringup.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(bringup.pid, signal.SIGKILL)
        log.close()
    reports = {m: json.loads((work / "validation" / m / "report.json").read_text()) for m in MODES}
    oracle = reports["oracle"]["summary"]["real_rate"]
    print(f"\ntruth {truth}; {args.trials} held-out trials per mode; training {'quick' if args.quick else 'default'}")
    print("mode       real success (95 % CI)        / oracle   twin v1 predicts   box end twin vs tracker (median)")
    for mode, report in reports.items():
        s = report["summary"]
        ratio = s["real_rate"] / oracle if oracle > 0 else float("nan")
        print(f"{mode:10s} {s['real_successes']:2d}/{s['trials']} {s['real_rate']:4.0%} "
              f"({s['real_interval'][0]:.0%}-{s['real_interval'][1]:.0%})   x{ratio:4.2f}    "
              f"{s['twin_successes']:2d}/{s['trials']} {s['twin_rate']:4.0%}        "
              f"{s['box_end_error_m']['median'] * 100:.1f} cm; modes {s['failure_modes']}")
    print(comparison.strip().splitlines()[-2])
    print("wall: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    print(f"work folder (bags, twins, policies, validation rounds): {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
