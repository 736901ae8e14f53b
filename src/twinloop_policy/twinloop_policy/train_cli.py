"""twinloop policy train: train the carry policy in a twin and export it for the runner.

    twinloop policy train OUT_DIR [--mode posterior] [--twin twins/emulated/v3]
        [--score-physics config/emulated_truth.yaml] [--task config/policy_task.yaml]
        [--seed 0] [--contexts N] [--draws K] [--iterations I] [--episodes E] [--workers W]
        [--ray-address local|auto|HOST:PORT] [--tracker-bag BAG]

--mode: `posterior` (default: the twin's identified parameters, mean +- std), `nominal`
(the twin's means, no randomization; default twin v0), `wide` (hand-set broad ranges,
config/policy_task.yaml variation.wide) or `oracle` (the physics file --oracle-physics:
the emulated cell's truth, for measurement only). --twin: a twin version folder (default:
the newest under twins/emulated, v0 for nominal; v0 is built when there is none).
--score-physics: also evaluate the trained student under this physics file (an emulated
cell's truth), labelled as a measurement no real cell offers. --ray-address: run the rollouts as tasks on a Ray cluster
(`local`: a Ray instance on this machine with --workers CPUs; `auto` or HOST:PORT: a running
cluster, see twinloop_policy/scaleout.py); the same seed gives the same policy either way.
--tracker-bag: a recorded session with the box tracker's poses; the tracker's noise and
latency measured from it replace the task file's stated ones (observation_model.py).
The rest override config/policy_task.yaml's training section for this run.

Progress lines show each teacher iteration's success rate; the end says where the policy
folder is and how it did. OUT_DIR must not exist (or be an empty folder).

Exit codes: 0 trained and written; 2 bad input (a malformed task file, no such twin, a
twin that cannot give the mode's variation, an existing OUT_DIR, a Ray cluster that cannot
be reached; one line on stderr says what to change).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Sequence

PROG = "twinloop policy train"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, help="policy folder to write (must not exist)")
    parser.add_argument("--mode", choices=("nominal", "posterior", "wide", "oracle"), default="posterior")
    parser.add_argument("--twin", default="", help="twin version folder (default: newest under twins/emulated; "
                                                   "v0 for --mode nominal)")
    parser.add_argument("--oracle-physics", default="", help="--mode oracle: the emulated cell's truth file")
    parser.add_argument("--score-physics", default="",
                        help="also evaluate under this physics file (an emulated cell's truth; measurement only)")
    parser.add_argument("--task", default="", help="task file (default: config/policy_task.yaml)")
    parser.add_argument("--seed", type=int, default=None, help="default: the task file's training.seed")
    parser.add_argument("--ray-address", default="", help="run the rollouts on Ray: local, auto or HOST:PORT")
    parser.add_argument("--tracker-bag", default="", help="a bag with the box tracker's poses: its measured noise "
                                                          "and latency replace the task file's")
    for flag, key, what in (("--contexts", "contexts", "box starts and goals the teacher solves"),
                            ("--draws", "physics_per_candidate", "draws each candidate is scored on"),
                            ("--iterations", "cem_iterations", "teacher (CEM) iterations"),
                            ("--episodes", "evaluation_episodes", "evaluation episodes"),
                            ("--workers", "workers", "threads stepping MuJoCo")):
        parser.add_argument(flag, dest=key, type=int, default=None, help=f"{what} (default: the task file's)")


def run(args: argparse.Namespace) -> int:
    from twinloop_logging.bag_reader import BagError
    from twinloop_policy.observation_model import ObservationModelError
    from twinloop_policy.policy_spec import PolicySpecError
    from twinloop_policy.scaleout import ScaleOutError
    from twinloop_policy.task import TaskConfigError
    from twinloop_policy.variation import VariationError
    from twinloop_twin.bundle import TwinError
    from twinloop_twin.physics import PhysicsConfigError
    try:
        return _train(args)
    except (TaskConfigError, VariationError, TwinError, PhysicsConfigError, PolicySpecError, ScaleOutError, BagError,
            ObservationModelError, OSError, ValueError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip() not in ("", "^")]
        print(f"{PROG}: error: {' '.join(lines)}", file=sys.stderr)
        return 2


def _say(line: str) -> None:
    print(line, flush=True)


def _train(args: argparse.Namespace) -> int:
    from twinloop_policy.task import load_task_config
    from twinloop_twin.physics import load_physics
    task = load_task_config(args.task or None)
    overrides = {k: getattr(args, k) for k in ("contexts", "physics_per_candidate", "cem_iterations",
                                               "evaluation_episodes", "workers") if getattr(args, k) is not None}
    bad = [f"{k}={v}" for k, v in overrides.items() if v < 1]
    if bad:
        raise ValueError(f"{', '.join(bad)}: give at least 1")
    if args.seed is not None:
        overrides["seed"] = args.seed
    task = dataclasses.replace(task, training=dataclasses.replace(task.training, **overrides))
    from twinloop_policy.policy_spec import check_new_folder
    folder = check_new_folder(args.folder)  # before the training, not only when it is written
    oracle = load_physics(args.oracle_physics) if args.oracle_physics else None
    scoring = load_physics(args.score_physics) if args.score_physics else None
    if args.mode == "oracle" and oracle is None:
        raise ValueError("--mode oracle needs --oracle-physics FILE (the emulated cell's truth; no real cell has one)")
    tracker = None
    if args.tracker_bag:
        from twinloop_policy.observation_model import tracker_model
        tracker = tracker_model(args.tracker_bag)
        task = dataclasses.replace(task, observation=dataclasses.replace(
            task.observation, box_position_std_m=tracker.position_std_m, box_latency_s=tracker.latency_s))
        _say(f"box tracker from {args.tracker_bag}: noise {tracker.position_std_m * 1e3:.2f} mm per axis at rest "
             f"(its covariance says {tracker.reported_std_m * 1e3:.2f} mm), latency {tracker.latency_s * 1e3:.0f} ms "
             f"({tracker.poses} poses, {tracker.rest_pairs} pairs at rest)")

    from twinloop_policy.carry import CarryPolicy, plan_carry
    from twinloop_policy.export import export_policy
    from twinloop_policy.rollouts import CarryRollouts
    from twinloop_policy.training import evaluate, train
    from twinloop_policy.variation import make_variation
    from twinloop_twin.bundle import MANIFEST_NAME, list_versions, load_twin, sha256_of
    from twinloop_twin.nominal import ensure_nominal_twin, load_scene, load_twin_workcell
    from twinloop_twin.residual import load_residual

    if args.twin:
        if not (Path(args.twin) / MANIFEST_NAME).is_file():
            parent = Path(args.twin).parent
            present = [f"v{v}" for v in list_versions(parent.parent, parent.name)] if parent.is_dir() else []
            raise ValueError(f"{args.twin} is not a twin version (no {MANIFEST_NAME}); versions in {parent}: "
                             f"{present or 'none'} (identification writes new ones: `twinloop build`)")
        bundle = load_twin(args.twin)
    else:
        bundle = ensure_nominal_twin(Path("twins"), "emulated", progress=_say)
        if args.mode == "nominal" and bundle.version != 0:
            bundle = load_twin(Path("twins") / "emulated" / "v0")
    twin = f"{bundle.workcell}/v{bundle.version}"
    variation = make_variation(args.mode, task, bundle.parameters, oracle=oracle)
    _say(f"training the carry policy in twin {twin} ({bundle.path}), variation {args.mode}, seed "
         f"{task.training.seed}: {task.training.contexts} contexts x {task.training.physics_per_candidate} draws x "
         f"{task.training.cem_population} actions x {task.training.cem_iterations} iterations, "
         f"{task.training.workers} workers")
    model = load_scene(bundle)
    workcell = load_twin_workcell(bundle)
    plan = plan_carry(task, workcell, model)
    policy = CarryPolicy(plan, task, hidden=task.training.student_hidden)
    # the version's learned residual acts in its physics (not under the oracle's true parameters)
    residual = load_residual(bundle, model) if args.mode != "oracle" else None
    if residual is not None:
        _say(f"twin {twin} carries a learned residual (twinloop_twin.residual): applied at every physics step")
    rollouts = CarryRollouts(model, policy, task, workcell.box.link, plan.box_z_m, workers=task.training.workers,
                             residual=residual.weights if residual is not None else None)
    if args.ray_address:
        from twinloop_policy.scaleout import RayRollouts
        rollouts = RayRollouts(rollouts, args.ray_address, workers=task.training.workers)
        _say(f"rollouts on Ray ({args.ray_address}): {rollouts.cpus} CPUs, {rollouts.chunks} tasks per batch")
    extra = {}
    try:
        result = train(task, rollouts, variation, progress=_say)
        if scoring is not None:
            from twinloop_policy.variation import ORACLE_LABEL
            started = time.perf_counter()
            scored = evaluate(task, rollouts, make_variation("oracle", task, oracle=scoring),
                              task.training.evaluation_episodes, task.training.seed + 2)
            low, high = scored.interval
            _say(f"under {args.score_physics} ({ORACLE_LABEL}): {scored.rate * 100:.0f} % "
                 f"(95 % interval {low * 100:.0f}-{high * 100:.0f} %, {scored.episodes} episodes, "
                 f"{time.perf_counter() - started:.0f} s)")
            extra["evaluation_under_truth"] = {"physics": str(args.score_physics), "label": ORACLE_LABEL,
                                               **scored.to_dict()}
    finally:
        if args.ray_address:
            rollouts.close()
    if args.ray_address:
        extra["ray_address"] = args.ray_address
    if tracker is not None:
        extra["tracker_model"] = tracker.to_dict()
    spec = export_policy(folder, result, task, twin=twin, twin_sha256=sha256_of(bundle.path / MANIFEST_NAME),
                         extra=extra)
    evaluation = result.evaluation
    low, high = evaluation.interval
    _say(f"wrote {spec.folder / 'policy.yaml'} and {spec.module_path}: {spec.policy_version} succeeds "
         f"{evaluation.rate * 100:.0f} % in the {args.mode} twin (95 % interval {low * 100:.0f}-{high * 100:.0f} %), "
         f"squeeze {evaluation.mean_squeeze_m * 1000:.1f} mm, carry {evaluation.mean_carry_s:.2f} s; "
         f"trained in {result.seconds:.0f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
