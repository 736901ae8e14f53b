"""The README's sequences under more drawn truths than `make test` runs (3 there).

Each seed draws a truth file (`twinloop_twin.truth_draw`), prints it, and runs what
test/test_randomized_physics.py runs for it: `twinloop demo --truth-file T`, then
`twinloop bringup --truth-file T` with one live calibration and the builder README's three
excitations, each checked against the drawn truth. Prints one summary per draw (commands,
exit codes, times, measured values, problems) and a table at the end; a failing seed is
reproduced with `--seeds N`. Not a test: it runs for minutes per draw and loads the machine.

    .venv/bin/python bench/randomized_physics.py [--seeds 0-9] [--work DIR]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

TEST_FILE = Path(__file__).resolve().parents[1] / "test" / "test_randomized_physics.py"


def load_runner():
    """run_draw from the test module (one definition of the sequence for the test and this bench)."""
    spec = importlib.util.spec_from_file_location("test_randomized_physics", TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.run_draw


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    return seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-9", help="e.g. 0-9 or 3,7,12")
    parser.add_argument("--work", default="", help="scratch folder (default: a new temporary one)")
    args = parser.parse_args()
    run_draw = load_runner()
    work = Path(args.work or tempfile.mkdtemp(prefix="randomized_physics_"))
    twins = work / "twins"
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; work folder {work}", flush=True)
    runs = []
    for seed in parse_seeds(args.seeds):
        started = time.monotonic()
        run = run_draw(seed, work / f"seed{seed}", twins=twins, say=lambda text: print(text, flush=True))
        runs.append((run, time.monotonic() - started, os.getloadavg()[0]))
        print(run.summary(), flush=True)
    print()
    print(f"{'seed':>4s}  {'result':7s} {'time':>6s} {'load':>5s}  first problem")
    for run, seconds, load in runs:
        print(f"{run.seed:4d}  {'ok' if run.ok else 'FAILED':7s} {seconds:5.0f}s {load:5.1f}  "
              f"{run.problems[0][:160] if run.problems else ''}")
    print(f"{sum(r.ok for r, _, _ in runs)} of {len(runs)} draws ran every sequence without a fault or traceback")


if __name__ == "__main__":
    main()
