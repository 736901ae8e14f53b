"""Benchmark: box mass, box friction and finger friction from the default box excitation
(config/excitation.yaml: the pushes, then the lift) under drawn truths, measured in one run.

For each seed a truth is drawn (`twinloop_twin.truth_draw`, printed), the pushes and lifts are
played on it in-process (`twinloop_builder.synthetic.simulate_session`, the emulated
workcell's own simulation and sensor noise) and identification's push stage fits the three
box parameters with the arm known (the truth's) from the simulator's box poses. Prints per
draw each estimate against the truth with its relative std and identifiable flag, then how
many draws had mass and friction identified and the largest error among those claimed.
With --tracked the same session is also identified from the box tracker's poses (the static
camera rendered at the cameras' rate with the truth's noise), side by side.
The shipped config/emulated_truth.yaml comes first unless --no-shipped-truth. Not a test:
~30-50 s per draw.

    .venv/bin/python bench/box_identification.py [--seeds 0-5] [--no-shipped-truth] [--no-lift | --tracked]
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")

from twinloop_builder import identification as ident  # noqa: E402
from twinloop_builder.excitation import (WorkspaceChecker, box_excitation, load_excitation_config,  # noqa: E402
                                         motion_limits)
from twinloop_builder.synthetic import simulate_session  # noqa: E402
from twinloop_twin.nominal import physics_parameters  # noqa: E402
from twinloop_twin.physics import load_physics  # noqa: E402
from twinloop_twin.scene import build_workcell_spec  # noqa: E402
from twinloop_twin.truth_draw import describe, draw_truth  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402

from randomized_physics import parse_seeds  # noqa: E402  (the other bench in this folder)

PRODUCT = "box.mass_kg*box.friction"
TRACKED_TEST = Path(__file__).resolve().parents[1] / "test" / "test_identification_tracked_box.py"


def tracked_sessions():
    """tracked_and_true_sessions from test/test_identification_tracked_box.py (one definition
    of the rendered, tracked session for the test and this bench)."""
    spec = importlib.util.spec_from_file_location("test_identification_tracked_box", TRACKED_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.tracked_and_true_sessions


def one_draw(seed: int, lifts: bool, tracked: bool) -> dict[str, dict[str, tuple[float, float, bool]]]:
    """{pose source: {parameter: (relative error, relative std, identifiable)}} for one truth
    (-1: the shipped one)."""
    config_dir = default_config_dir()
    workcell = load_workcell()
    nominal = load_physics(config_dir / "nominal_physics.yaml")
    truth = load_physics(config_dir / "emulated_truth.yaml") if seed < 0 else draw_truth(nominal, seed)
    print("config/emulated_truth.yaml" if seed < 0 else describe(truth, nominal), flush=True)
    spec = build_workcell_spec(workcell, nominal)
    if tracked:
        sessions = dict(zip(("tracked", "ground truth"), tracked_sessions()(workcell, nominal, truth)))
    else:
        config = load_excitation_config(config_dir / "excitation.yaml")
        if not lifts:
            config = dataclasses.replace(config, lifts=())
        checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
        max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
        segments = box_excitation(config, workcell.box.size_m[0] / 2, workcell.home_joint_positions, checker,
                                  max_speed=max_speed, max_acceleration=max_acceleration)
        sessions = {"ground truth": simulate_session(workcell, truth, segments, seed=5)}
    truth_values = physics_parameters(truth, source="truth").means()
    prior = dict(truth_values)  # the arm known; the box at its nominal values
    truth_values[PRODUCT] = truth_values["box.mass_kg"] * truth_values["box.friction"]
    for name in ident.BOX_PARAMETERS:
        prior[name] = physics_parameters(nominal, source="nominal").means()[name]
    out = {}
    for source, session in sessions.items():
        started = time.monotonic()
        result = ident.identify(spec, prior, [session], select=list(ident.BOX_PARAMETERS),
                                settings=ident.IdentificationSettings())
        out[source] = {}
        for name in (*ident.BOX_PARAMETERS, PRODUCT):
            estimate = result.estimates.get(name) or result.derived[name]
            error = estimate.mean / truth_values[name] - 1
            out[source][name] = (error, estimate.std / estimate.mean, estimate.identifiable)
            print(f"  {source:12s} {name:26s} {estimate.mean:.4f} (truth {truth_values[name]:.4f}, {error:+6.1%}), "
                  f"std {estimate.std / estimate.mean:5.1%}, {'identifiable' if estimate.identifiable else 'flagged'}")
        print(f"  {source}: identified in {time.monotonic() - started:.0f} s", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-5", help="drawn truths, e.g. 0-5 or 3,7")
    parser.add_argument("--no-shipped-truth", action="store_true", help="leave config/emulated_truth.yaml out")
    parser.add_argument("--no-lift", action="store_true", help="the pushes alone (the lifts left out)")
    parser.add_argument("--tracked", action="store_true",
                        help="also from the box tracker's poses (static camera rendered; ~1.5 min more per draw)")
    args = parser.parse_args()
    if args.tracked and args.no_lift:
        parser.error("--tracked plays the shipped excitation (with its lifts); leave out --no-lift")
    seeds = ([] if args.no_shipped_truth else [-1]) + parse_seeds(args.seeds)
    runs = {seed: one_draw(seed, not args.no_lift, args.tracked) for seed in seeds}
    print()
    for source in next(iter(runs.values())):
        apart = [s for s, r in runs.items() if r[source]["box.mass_kg"][2] and r[source]["box.friction"][2]]
        claimed = [abs(e) for r in runs.values() for e, _, ok in r[source].values() if ok]
        every = [abs(e) for r in runs.values() for e, _, _ in r[source].values()]
        print(f"{source}: mass and friction both identifiable in {len(apart)} of {len(runs)} truths ({apart}; "
              f"-1 is the shipped one); largest |error| among identifiable estimates "
              f"{max(claimed, default=0.0):.1%}, of all {max(every):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
