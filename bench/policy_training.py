"""Benchmark of the carry policy's training (twinloop_policy), measured in one run.

1. Throughput: physics steps per second of the vectorized rollouts (twinloop_policy.rollouts,
   2 worker threads, one MjData and model copy per episode) against raw MuJoCo stepping of
   the same scene in one thread; the ratio (goal >= 0.7).
2. A twin identified from the cell: a 30 s joint excitation and the default box excitation
   (pushes, lift) simulated in-process on the truth (config/emulated_truth.yaml, or a drawn
   one with --seed; the emulated workcell's simulation and sensor noise) and identified from
   the nominal twin (twinloop_builder.identification): its parameters are the posterior.
3. Per variation mode (nominal: the nominal twin's means; posterior: the identified twin;
   wide: hand-set ranges; oracle: the truth itself, a measurement no real cell offers) a
   training with the task file's setting (config/policy_task.yaml training): wall time, the
   time until the teacher's best action first succeeds in >= 90 % of its draws, the student's
   success in its own twin and under the truth (95 % Wilson intervals), the action chosen.

    .venv/bin/python bench/policy_training.py [--seed N] [--modes nominal,posterior,wide,oracle]

Not a test: about 12 minutes with the shipped settings.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")  # (no ROS here; the project's rule)

import mujoco  # noqa: E402
import numpy as np  # noqa: E402

from twinloop_builder import identification as ident  # noqa: E402
from twinloop_builder.build import identified_parameters  # noqa: E402
from twinloop_builder.excitation import (JointExcitationConfig, WorkspaceChecker, box_excitation,  # noqa: E402
                                         joint_excitation, load_excitation_config, motion_limits)
from twinloop_builder.synthetic import simulate_session  # noqa: E402
from twinloop_policy.carry import CarryPolicy, plan_carry  # noqa: E402
from twinloop_policy.rollouts import CarryRollouts, Episode  # noqa: E402
from twinloop_policy.task import load_task_config  # noqa: E402
from twinloop_policy.training import draw_contexts, evaluate, train  # noqa: E402
from twinloop_policy.variation import ORACLE_LABEL, make_variation  # noqa: E402
from twinloop_twin.nominal import physics_parameters  # noqa: E402
from twinloop_twin.physics import ARM_JOINTS, load_physics  # noqa: E402
from twinloop_twin.scene import build_workcell_spec  # noqa: E402
from twinloop_twin.truth_draw import describe, draw_truth  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402


def throughput(task, workcell, model, plan) -> tuple[float, float]:
    """(vectorized steps/s, raw steps/s) on the same scene."""
    policy = CarryPolicy(plan, task)
    rollouts = CarryRollouts(model, policy, task, workcell.box.link, plan.box_z_m, workers=2)
    values = physics_parameters(load_physics(default_config_dir() / "nominal_physics.yaml"), source="n").means()
    contexts = draw_contexts(task, policy, 16, np.random.default_rng(0))
    episodes = [Episode(values, c.box_xy, c.seen_box_offset, c.goal_xy, 0.015, 1.0) for c in contexts]
    started = time.perf_counter()
    rollouts.run(episodes)
    vectorized = rollouts.steps_taken / (time.perf_counter() - started)
    raw_model = copy.copy(model)
    data = mujoco.MjData(raw_model)
    mujoco.mj_resetDataKeyframe(raw_model, data, 0)
    steps = 40000
    started = time.perf_counter()
    mujoco.mj_step(raw_model, data, nstep=steps)
    return vectorized, steps / (time.perf_counter() - started)


def identified_twin(workcell, nominal, truth):
    """The nominal twin's parameters updated by an identification of `truth` (as `twinloop build` writes them)."""
    spec = build_workcell_spec(workcell, nominal)
    model = spec.compile()
    amplitude = {**{j: 0.4 for j in ARM_JOINTS}, "panda_finger_joint1": 0.0}
    joints = joint_excitation(JointExcitationConfig(duration_s=30.0, ramp_s=1.5, amplitude=amplitude, seed=0),
                              workcell.home_joint_positions, model, workcell.urdf_xml, workcell.table_top_height_m)
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    boxes = box_excitation(config, workcell.box.size_m[0] / 2, workcell.home_joint_positions,
                           WorkspaceChecker(model, workcell.table_top_height_m), max_speed=max_speed,
                           max_acceleration=max_acceleration)
    fit = [simulate_session(workcell, truth, [joints], name="joints", seed=1),
           simulate_session(workcell, truth, boxes, name="box", seed=5)]
    prior = physics_parameters(nominal, source="nominal")
    result = ident.identify(spec, prior.means(), fit)
    return identified_parameters(prior, result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=None, help="a drawn truth (default: config/emulated_truth.yaml)")
    parser.add_argument("--modes", default="nominal,posterior,wide,oracle")
    args = parser.parse_args()
    config = default_config_dir()
    task = load_task_config()
    workcell = load_workcell()
    nominal = load_physics(config / "nominal_physics.yaml")
    truth = load_physics(config / "emulated_truth.yaml") if args.seed is None else draw_truth(nominal, args.seed)
    print("truth: " + ("config/emulated_truth.yaml" if args.seed is None else describe(truth, nominal)), flush=True)
    spec = build_workcell_spec(workcell, nominal)
    model = spec.compile()
    plan = plan_carry(task, workcell, model)

    vectorized, raw = throughput(task, workcell, model, plan)
    print(f"throughput: vectorized rollouts (2 workers) {vectorized:,.0f} steps/s, raw MuJoCo (1 thread) "
          f"{raw:,.0f} steps/s: ratio {vectorized / raw:.2f} (goal >= 0.7)", flush=True)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    v0 = physics_parameters(nominal, source="nominal")
    twins = {"nominal": v0, "wide": v0}
    if "posterior" in modes:
        started = time.perf_counter()
        twins["posterior"] = identified_twin(workcell, nominal, truth)
        values = physics_parameters(truth, source="t").means()
        shown = ("box.mass_kg", "box.friction", "finger.friction", "actuator.panda_finger_joint1.kp")
        print(f"identified twin ({time.perf_counter() - started:.0f} s): "
              f"{sum(p.identifiable for p in twins['posterior'].values())} of {len(v0)} parameters identifiable; "
              + ", ".join(f"{n} {twins['posterior'][n].mean:.4g} +- {twins['posterior'][n].std:.2g} "
                          f"({'identified' if twins['posterior'][n].identifiable else 'prior'}; truth {values[n]:.4g})"
                          for n in shown), flush=True)
    rows = []
    for mode in modes:
        variation = make_variation(mode, task, twins.get(mode), oracle=truth)
        policy = CarryPolicy(plan, task, hidden=task.training.student_hidden)
        rollouts = CarryRollouts(model, policy, task, workcell.box.link, plan.box_z_m, workers=task.training.workers)
        print(f"-- {mode}", flush=True)
        result = train(task, rollouts, variation, progress=lambda line: print("   " + line, flush=True))
        teacher = [c for c in result.curve if c["stage"] == "teacher"]
        reached = next((sum(c["seconds"] for c in teacher[:i + 1]) for i, c in enumerate(teacher)
                        if c["best_success_rate"] >= 0.9), None)
        under_truth = evaluate(task, rollouts, make_variation("oracle", task, oracle=truth),
                               task.training.evaluation_episodes, task.training.seed + 2)
        rows.append((mode, result, reached, under_truth))
    print()
    print(f"setting: {task.training.contexts} contexts x {task.training.physics_per_candidate} draws, "
          f"{task.training.cem_population} actions x {task.training.cem_iterations} iterations; "
          f"{task.training.evaluation_episodes} evaluation episodes; under the truth = {ORACLE_LABEL}")
    print("| mode | training wall time | teacher >= 90 % after | success in its twin (95 %) | "
          "success under the truth (95 %) | squeeze, carry |")
    print("|---|---|---|---|---|---|")
    for mode, result, reached, under_truth in rows:
        e = result.evaluation
        print(f"| {mode} | {result.seconds:.0f} s | {'%.0f s' % reached if reached is not None else 'never'} | "
              f"{e.rate:.0%} ({e.interval[0]:.0%}-{e.interval[1]:.0%}) | {under_truth.rate:.0%} "
              f"({under_truth.interval[0]:.0%}-{under_truth.interval[1]:.0%}) | {e.mean_squeeze_m * 1000:.1f} mm, "
              f"{e.mean_carry_s:.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
