"""Benchmark: are identification's intervals calibrated over drawn truths?

For each seed a truth is drawn around the nominal physics (twinloop_twin.truth_draw, as the
tests draw them), a joint excitation of `--length` s is simulated in-process on it (with its
sensor noise; no DDS), and the arm is identified from the nominal twin. Every joint, actuator
and command parameter flagged identifiable is scored against its true value: z = (estimate -
true value) / std (the reported std, linearized in the parameter's own units), and whether
the true value lies inside its 95 % interval (symmetric in the log of the parameter).
Calibrated intervals put 90-99 % of the true values inside and give z a root mean square
(about 0) near 1; intervals that are too wide give an RMS well below 1, too narrow ones well
above. Parameters not flagged identifiable are not scored. Printed per seed and pooled, with
the goals of the validation issue (inside fraction in [0.90, 0.99], z RMS in [0.75, 1.33]);
exit status 1 when one is not met. `--lag` sets the intervals' Newey-West lag window
(IdentificationSettings.interval_lag_s, default 0.2 s).

    .venv/bin/python bench/uncertainty_calibration.py                  # seeds 0-7, 10 s each
    .venv/bin/python bench/uncertainty_calibration.py --seeds 0-3 --length 20 --lag 0.5
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

INSIDE_GOAL = (0.90, 0.99)
RMS_GOAL = (0.75, 1.33)


def seeds_from(text: str) -> list[int]:
    if "-" in text:
        first, last = text.split("-")
        return list(range(int(first), int(last) + 1))
    return [int(s) for s in text.split(",")]


def score_one(seed: int, length_s: float, lag_s: float) -> dict:
    from twinloop_builder import identification as ident
    from twinloop_builder.excitation import JointExcitationConfig, joint_excitation
    from twinloop_builder.synthetic import simulate_session
    from twinloop_twin.nominal import physics_parameters
    from twinloop_twin.physics import ARM_JOINTS, load_physics
    from twinloop_twin.scene import build_workcell_spec
    from twinloop_twin.truth_draw import describe, draw_truth
    from twinloop_twin.workcell import default_config_dir, load_workcell

    workcell = load_workcell()
    nominal = load_physics(default_config_dir() / "nominal_physics.yaml")
    truth = draw_truth(nominal, seed)
    print(describe(truth, nominal).splitlines()[0], flush=True)
    spec = build_workcell_spec(workcell, nominal)
    amplitude = {**{j: 0.4 for j in ARM_JOINTS}, "panda_finger_joint1": 0.0}
    trajectory = joint_excitation(JointExcitationConfig(duration_s=length_s, ramp_s=1.5, amplitude=amplitude, seed=0),
                                  workcell.home_joint_positions, spec.compile(), workcell.urdf_xml,
                                  workcell.table_top_height_m)
    fit = simulate_session(workcell, truth, [trajectory], name=f"fit-seed{seed}", seed=seed + 100)
    started = time.monotonic()
    result = ident.identify(spec, physics_parameters(nominal, source="n").means(), [fit],
                            settings=ident.IdentificationSettings(interval_lag_s=lag_s))
    wall = time.monotonic() - started
    values = physics_parameters(truth, source="t").means()
    scored = {name: ((e.mean - values[name]) / e.std, bool(e.ci_low <= values[name] <= e.ci_high))
              for name, e in result.estimates.items()
              if e.identifiable and name in values and name.startswith(("joint.", "actuator.", "command."))}
    return {"seed": seed, "wall_s": wall, "z": {n: z for n, (z, _) in scored.items()},
            "inside": {n: inside for n, (_, inside) in scored.items()}}


def summary(z: np.ndarray, inside: np.ndarray) -> str:
    return (f"{len(z)} parameters, {inside.mean():.1%} inside their 95 % interval, z RMS {rms(z):.2f} "
            f"(mean {z.mean():+.2f}, standard deviation {z.std():.2f}, largest |z| {np.abs(z).max():.2f})")


def rms(z: np.ndarray) -> float:
    return float(np.sqrt(np.mean(z ** 2)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-7", help="truth draws, e.g. 0-7 or 1,4,9")
    parser.add_argument("--length", type=float, default=10.0, help="s of joint excitation per truth")
    parser.add_argument("--lag", type=float, default=0.2, help="s, the intervals' Newey-West lag window")
    args = parser.parse_args()
    rows = []
    for seed in seeds_from(args.seeds):
        row = score_one(seed, args.length, args.lag)
        rows.append(row)
        print(f"seed {seed}: {summary(np.array(list(row['z'].values())), np.array(list(row['inside'].values())))}; "
              f"identification {row['wall_s']:.0f} s", flush=True)
    z = np.concatenate([list(r["z"].values()) for r in rows])
    inside = np.concatenate([list(r["inside"].values()) for r in rows])
    met_inside = INSIDE_GOAL[0] <= inside.mean() <= INSIDE_GOAL[1]
    met_rms = RMS_GOAL[0] <= rms(z) <= RMS_GOAL[1]
    print(f"pooled over {len(rows)} truths: {summary(z, inside)}; goals: inside in {INSIDE_GOAL} "
          f"{'met' if met_inside else 'NOT met'}, z RMS in {RMS_GOAL} {'met' if met_rms else 'NOT met'}")
    print(json.dumps({"length_s": args.length, "lag_s": args.lag, "rows": rows}, indent=1))
    return 0 if met_inside and met_rms else 1


if __name__ == "__main__":
    sys.exit(main())
