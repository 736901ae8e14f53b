"""Benchmark of physics identification (twinloop_builder) against recording length.

For each length (default 30, 60, 120 s of joint excitation) a fit session and a 10 s
held-out session are simulated in-process on the hidden truth (config/emulated_truth.yaml,
with its sensor noise; no DDS), identified from the nominal twin, and reported: wall time,
peak memory (max RSS of a child process per length), parameter errors against the truth,
how many truth values fall inside their intervals, and the held-out RMSE ratio. Each row
also says whether the goals the tests assert on 3 s recordings
(src/twinloop_builder/test/test_identification.py) hold on the long one: delay within
1 ms, every arm gain identifiable, at least 25 parameters identifiable, gains and damping
within 5 %, held-out RMSE ratio <= 0.3. Exit status 1 when one does not.

    .venv/bin/python bench/identification.py                 # 30 60 120 s
    .venv/bin/python bench/identification.py --lengths 30    # one length
    .venv/bin/python bench/identification.py --truth emulated_truth_slow.yaml
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import time


def run_one(length_s: float, truth_file: str, queue) -> None:
    from twinloop_builder import identification as ident
    from twinloop_builder.excitation import JointExcitationConfig, joint_excitation
    from twinloop_builder.synthetic import simulate_session
    from twinloop_twin.nominal import physics_parameters
    from twinloop_twin.physics import ARM_JOINTS, load_physics
    from twinloop_twin.scene import build_workcell_spec
    from twinloop_twin.workcell import default_config_dir, load_workcell

    workcell = load_workcell()
    nominal = load_physics(default_config_dir() / "nominal_physics.yaml")
    truth = load_physics(default_config_dir() / truth_file)
    spec = build_workcell_spec(workcell, nominal)
    model = spec.compile()
    amplitude = {**{j: 0.4 for j in ARM_JOINTS}, "panda_finger_joint1": 0.0}

    def excitation(duration, seed):
        return joint_excitation(JointExcitationConfig(duration_s=duration, ramp_s=1.5, amplitude=amplitude, seed=seed),
                                workcell.home_joint_positions, model, workcell.urdf_xml, workcell.table_top_height_m)

    fit = simulate_session(workcell, truth, [excitation(length_s, 0)], name=f"fit{length_s:.0f}", seed=1)
    held = simulate_session(workcell, truth, [excitation(10.0, 7)], name="held", split="held_out", seed=2)
    started = time.monotonic()
    result = ident.identify(spec, physics_parameters(nominal, source="n").means(), [fit], held_out=[held])
    wall = time.monotonic() - started
    values = physics_parameters(truth, source="t").means()
    errors = {n: e.mean / values[n] - 1 for n, e in result.estimates.items() if e.identifiable}
    inside = sum(e.ci_low <= values[n] <= e.ci_high for n, e in result.estimates.items() if e.identifiable)
    by_kind = {}
    for name, error in errors.items():
        by_kind.setdefault(name.split(".")[-1], []).append(abs(error))
    delay = result.estimates["command.delay_s"]
    ratio = result.held_out_rmse_after_rad / result.held_out_rmse_before_rad
    goals = {"delay within 1 ms": delay.identifiable and abs(delay.mean - values["command.delay_s"]) <= 0.001,
             "every arm gain identifiable": all(result.estimates[f"actuator.{j}.kp"].identifiable for j in ARM_JOINTS),
             ">= 25 identifiable": len(errors) >= 25,
             "gains and damping within 5 %": all(abs(e) <= 0.05 for n, e in errors.items()
                                                 if n.split(".")[-1] in ("kp", "kv", "damping")),
             "held-out ratio <= 0.3": ratio <= 0.3}
    queue.put({"length_s": length_s, "wall_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "identifiable": len(errors), "inside_interval": inside,
               "max_abs_error": {k: max(v) for k, v in by_kind.items()},
               "delay_error_ms": (result.estimates["command.delay_s"].mean - values["command.delay_s"]) * 1e3,
               "rmse_before_mrad": result.held_out_rmse_before_rad * 1e3,
               "rmse_after_mrad": result.held_out_rmse_after_rad * 1e3,
               "rmse_ratio": ratio, "goals_failed": [g for g, ok in goals.items() if not ok],
               "iterations": [s.iterations for s in result.stages],
               "residual_evaluations": [s.residual_evaluations for s in result.stages]})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=float, nargs="+", default=[30.0, 60.0, 120.0])
    parser.add_argument("--truth", default="emulated_truth.yaml")
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")  # a fresh process per length: its own peak RSS
    rows = []
    for length in args.lengths:
        queue = context.Queue()
        process = context.Process(target=run_one, args=(length, args.truth, queue))
        process.start()
        rows.append(queue.get())
        process.join()
        row = rows[-1]
        errors = ", ".join(f"{k} {v:.1%}" for k, v in sorted(row["max_abs_error"].items()))
        print(f"{length:5.0f} s: wall {row['wall_s']:6.1f} s, peak RSS {row['peak_rss_mb']:6.0f} MB, "
              f"{row['identifiable']} identifiable ({row['inside_interval']} truths inside their 95 % interval), "
              f"max |error| by quantity: {errors}; delay error {row['delay_error_ms']:+.2f} ms; held-out RMSE "
              f"{row['rmse_before_mrad']:.3f} -> {row['rmse_after_mrad']:.4f} mrad (ratio {row['rmse_ratio']:.3f}); "
              f"iterations {row['iterations']}, residual evaluations {row['residual_evaluations']}; goals "
              f"{'met' if not row['goals_failed'] else 'NOT met: ' + ', '.join(row['goals_failed'])}", flush=True)
    base = rows[0]
    for row in rows[1:]:
        print(f"ratio {row['length_s']:.0f} s / {base['length_s']:.0f} s: wall {row['wall_s'] / base['wall_s']:.2f}, "
              f"peak RSS {row['peak_rss_mb'] / base['peak_rss_mb']:.2f}")
    print(json.dumps(rows, indent=1))
    return 1 if any(row["goals_failed"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
