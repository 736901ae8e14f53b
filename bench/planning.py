"""Motion planning in the emulated cell's scene: success, planning time, path length, and how
closely the emulated robot (its hidden physics) follows what was planned.

Goals: random joint positions, uniform within the envelope's position limits, kept when
they are valid states (no collision, inside the workspace, out of the keep-out boxes) of
the scene the planner sees; the starts: home for the first half, the previous goal after
(moves between arbitrary poses). The scene: the nominal twin's geometry with the shipped
envelope (config/envelope.yaml) plus, with `--column` (default), a keep-out column on the
table in front of the robot that many moves must go around.

Each plan is then executed in MuJoCo under config/emulated_truth.yaml (the emulated cell's
hidden physics), the targets applied at the command period: the tracking error is the
largest joint distance between the measured and the commanded position along the move, and
every measured state is checked against the scene (no contact).

    .venv/bin/python bench/planning.py [--goals 100] [--no-column] [--planner RRTConnect]

Prints per-goal lines with --verbose, then the summary the README's table shows.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src" / "twinloop_planning" / "test"))
from test_planner import envelope_with_column  # noqa: E402

from twinloop_planning.config import load_planning_config  # noqa: E402
from twinloop_planning.planner import PlanningError, plan  # noqa: E402
from twinloop_planning.scene import PlanningScene  # noqa: E402
from twinloop_sim.workcell_sim import WorkcellSimulation  # noqa: E402
from twinloop_twin.motion import tracking_report  # noqa: E402
from twinloop_twin.nominal import build_nominal_twin  # noqa: E402
from twinloop_twin.physics import load_physics  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402


def execute(sim: WorkcellSimulation, names: list[str], positions: np.ndarray, period_s: float) -> np.ndarray:
    """Measured positions (true, noise-free) at each command of the planned targets."""
    sim.reset(dict(zip(names, positions[0].tolist())))
    measured = []
    for k, q in enumerate(positions):
        sim.command(names, q.tolist())
        sim.step_until((k + 1) * period_s)
        truth = sim.true_joint_positions()
        measured.append([truth[j] for j in names])
    return np.array(measured)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--goals", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-column", action="store_true", help="only the shipped envelope's keep-out boxes")
    parser.add_argument("--planner", default=None, help="OMPL planner (default: config/planning.yaml's)")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench_planning_"))
    twin = build_nominal_twin(work / "twins", "emulated")
    envelope = default_config_dir() / "envelope.yaml" if args.no_column else envelope_with_column(work)
    settings, scene_settings = load_planning_config()
    if args.planner:
        settings = type(settings)(**{**settings.__dict__, "planner": args.planner})
    scene = PlanningScene.from_twin(twin.path, envelope, scene_settings)
    names = list(scene.joint_names)
    home_positions = load_workcell().home_joint_positions
    home = np.array([home_positions[j] for j in names])
    sim = WorkcellSimulation(load_workcell(), load_physics(default_config_dir() / "emulated_truth.yaml"))
    rng = np.random.default_rng(args.seed)

    goals = []
    drawn = 0
    while len(goals) < args.goals:
        q = rng.uniform(scene.lower, scene.upper)
        drawn += 1
        if scene.valid(q):
            goals.append(q)
    print(f"{args.goals} valid goals from {drawn} uniform draws ({100 * args.goals / drawn:.0f} % of joint space is "
          f"valid); scene: nominal twin, envelope {'with the column' if not args.no_column else 'as shipped'}; "
          f"planner {settings.planner}")

    times, ratios, durations, tracking, lags, sampled, failures, contacts = [], [], [], [], [], 0, [], 0
    start = home
    began = time.perf_counter()
    for index, goal in enumerate(goals):
        if index < args.goals // 2:
            start = home
        try:
            trajectory = plan(start, goal, scene, settings)
        except PlanningError as error:
            failures.append(f"goal {index}: {error.code}: {error}")
            if args.verbose:
                print(failures[-1])
            continue
        times.append(trajectory.planning_s)
        straight = float(np.linalg.norm(goal - start))
        ratios.append(trajectory.path_length_rad / straight if straight > 0 else 1.0)
        durations.append(trajectory.duration_s)
        sampled += trajectory.sampled
        measured = execute(sim, names, trajectory.positions, trajectory.period_s)
        tracking.append(float(np.max(np.abs(measured[:, :7] - trajectory.positions[:, :7]))))
        stamps = np.arange(len(measured)) * trajectory.period_s
        lags.append(tracking_report(stamps, trajectory.positions[:, :7], stamps, measured[:, :7], names[:7]).latency_s)
        contacts += sum(scene.contact(np.clip(q, scene.lower, scene.upper), clearance_m=0.0) is not None
                        for q in measured[::10])
        if args.verbose:
            print(f"goal {index}: {'sampled' if trajectory.sampled else 'straight'}, planned in "
                  f"{trajectory.planning_s:.3f} s, path x{ratios[-1]:.2f} the straight line, {trajectory.duration_s:.2f} s, "
                  f"tracking max {tracking[-1] * 1e3:.1f} mrad")
        start = goal
    elapsed = time.perf_counter() - began
    times, ratios, tracking = np.array(times), np.array(ratios), np.array(tracking)
    print(f"success {len(times)}/{args.goals} ({100 * len(times) / args.goals:.0f} %); {sampled} needed sampling "
          f"(the straight line blocked), {len(times) - sampled} took the straight line")
    print(f"planning time (plan + time + envelope check): median {np.median(times):.3f} s, p95 "
          f"{np.percentile(times, 95):.3f} s, max {times.max():.3f} s")
    if sampled:
        around = np.array([r for r, t in zip(ratios, times) if r > 1.0 + 1e-9])
        if around.size:
            print(f"path length / straight line, sampled plans: median {np.median(around):.2f}, p95 "
                  f"{np.percentile(around, 95):.2f}")
    print(f"motion duration: median {np.median(durations):.2f} s")
    print(f"executed vs planned (emulated truth physics), largest joint error per move: median "
          f"{np.median(tracking) * 1e3:.1f} mrad, p95 {np.percentile(tracking, 95) * 1e3:.1f} mrad, max "
          f"{tracking.max() * 1e3:.1f} mrad; the measured motion lags the command by {np.median(lags) * 1e3:.0f} ms "
          f"(median best-aligning shift: command delay and servo lag); measured states in contact: {contacts}")
    for failure in failures:
        print("  " + failure)
    print(f"bench: {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
