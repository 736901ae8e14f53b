"""twinloop plan: plan a collision-free move in the twin, and make it on the robot.

    twinloop plan check --to 0.3,-0.5,0,-2.2,0,1.7,0.8            # offline: the plan from home, or why none
    twinloop plan check --to home --from 0.3,-0.5,0,-2.2,0,1.7,0.8 --twin twins/emulated/v0
    twinloop plan move --to home                                 # from where the robot is, through the monitor

GOAL and START: `home` (the workcell's home pose, config/workcell.yaml) or joint positions
separated by commas, in the order panda_joint1..7 (rad), then optionally the gripper
panda_finger_joint1 (m, 0 closed to 0.04 open; left out, it keeps its value). A value list
that begins with a minus sign is written with `=`: `--to=-0.6,0.3,0,-2.5,0,3.6,0.8`.

The scene: a twin version's geometry (`--twin`; default: the workcell description's, no
twin needed) with the envelope's workspace and keep-out boxes (`--envelope`, default
config/envelope.yaml); the planner's settings come from `--config` (config/planning.yaml).

`move` reads the robot's position from /joint_states on $ROS_DOMAIN_ID, plans from there,
arms the envelope monitor if it is disarmed (and disarms it after), streams the trajectory
on /twinloop/planning/command (an input of the monitor) at the monitor's command period,
and waits until the arm has settled at the goal. A latched fault is not reset for you:
check the cell, `twinloop monitor reset`, then move (e.g. back home).

Exit codes: 0 done; 2 bad input (a goal that is not a valid state, a malformed goal, twin,
envelope or planning file); 3 the robot or the monitor is not there, or a fault is latched;
4 no path found, the envelope check refused the plan, or the move failed (a fault while
moving, the goal not reached); 130 Ctrl-C (the robot holds where it is).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from twinloop_planning.config import PlanningConfigError, load_planning_config
from twinloop_planning.planner import PlannedTrajectory, PlannerSettings, PlanningError, plan
from twinloop_planning.scene import PlanningScene
from twinloop_twin.bundle import TwinError
from twinloop_twin.cli import one_line

PROG = "twinloop plan"
BAD_INPUT_CODES = ("bad_request", "start_invalid", "goal_invalid", "ik_failed")


def parse_positions(text: str, scene: PlanningScene, home: np.ndarray, held: np.ndarray) -> np.ndarray:
    """`home`, or 7 (arm; the gripper keeps `held`'s value) or 8 comma-separated values."""
    if text.strip() == "home":
        return home.copy()
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise PlanningError("bad_request", f"{text!r} is not 'home' or joint positions separated by commas") from None
    n = len(scene.joint_names)
    if len(values) == n - 1:
        return np.append(values, held[-1])
    if len(values) != n:
        raise PlanningError("bad_request", f"{text!r} has {len(values)} values; give {n - 1} (the arm) or {n} "
                            f"({', '.join(scene.joint_names)})")
    return np.array(values)


def summary(trajectory: PlannedTrajectory, start: np.ndarray, goal: np.ndarray) -> str:
    if len(trajectory.positions) == 1:
        return "path: none needed, the start is the goal"
    how = "sampled around obstacles" if trajectory.sampled else "the straight line is clear"
    return (f"path: {len(trajectory.waypoints)} waypoints, joint-space length {trajectory.path_length_rad:.2f} "
            f"(straight line {np.linalg.norm(goal - start):.2f}; {how}); {trajectory.duration_s:.2f} s of motion "
            f"as {len(trajectory.positions) - 1} commands of {trajectory.period_s * 1e3:.0f} ms; planned and checked in "
            f"{trajectory.planning_s:.2f} s")


def _scene(args) -> tuple[PlanningScene, PlannerSettings, np.ndarray]:
    from twinloop_twin.workcell import load_workcell

    planner, scene_settings = load_planning_config(args.config)
    if args.speed is not None:
        if not args.speed > 0:
            raise PlanningError("bad_request", f"--speed must be > 0, got {args.speed}")
        planner = PlannerSettings(**{**planner.__dict__, "max_velocity_rad_s": args.speed})
    if args.twin:
        if not (Path(args.twin) / "twin.yaml").is_file():
            raise PlanningError("bad_request", f"{args.twin} is not a twin version folder (no twin.yaml): give one "
                                "such as twins/emulated/v0 (`twinloop twin list` lists them)")
        scene = PlanningScene.from_twin(args.twin, args.envelope, scene_settings)
    else:
        scene = PlanningScene.from_workcell(load_workcell(), args.envelope, scene_settings)
    home_positions = load_workcell().home_joint_positions
    home = np.array([home_positions[j] for j in scene.joint_names])
    return scene, planner, home


def _check(args) -> int:
    scene, settings, home = _scene(args)
    start = parse_positions(args.start, scene, home, home)
    goal = parse_positions(args.to, scene, home, start)
    trajectory = plan(start, goal, scene, settings)
    print(summary(trajectory, start, goal))
    return 0


def _move(args) -> int:
    from twinloop_ros.command_line import run_live

    scene, settings, home = _scene(args)
    parse_positions(args.to, scene, home, home)  # a malformed goal is refused before anything starts
    return run_live(PROG, lambda session: _move_live(session, args, scene, settings, home))


def _move_live(session, args, scene: PlanningScene, settings: PlannerSettings, home: np.ndarray) -> int:
    from twinloop_planning.mover_node import SETTLE_TOLERANCE_RAD, LiveMover
    from twinloop_ros.clients import EnvelopeClient
    from twinloop_ros.command_line import Progress

    progress = Progress()
    monitor = EnvelopeClient(session.node)
    mover = LiveMover(session.node, scene, settings, monitor, command_topic=args.topic, joint_states=args.joint_states)
    mover.ready(args.timeout)  # a latched fault is refused before planning
    progress("planning")
    start, goal, trajectory = mover.plan_from_here(lambda start: parse_positions(args.to, scene, home, start),
                                                   args.timeout)
    progress(summary(trajectory, start, goal))
    mover.execute(trajectory, goal, args.timeout, progress)
    print(f"reached: every joint within {SETTLE_TOLERANCE_RAD} of the goal after {trajectory.duration_s:.2f} s "
          f"of motion")
    print(summary(trajectory, start, goal))  # the plan that was made
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (("check", "plan offline and print the plan (nothing moves)"),
                       ("move", "plan from the robot's position and make the move through the envelope monitor")):
        command = sub.add_parser(name, help=text, description=text)
        command.add_argument("--to", required=True, metavar="GOAL",
                             help="'home' or joint positions, comma-separated: panda_joint1..7 in rad, then "
                             "optionally the gripper in m; a list beginning with a minus sign: --to=-0.6,...")
        command.add_argument("--twin", default="", help="twin version folder whose geometry to plan in "
                             "(default: the workcell description's)")
        command.add_argument("--envelope", default=None, help="envelope monitor parameter file (default "
                             "config/envelope.yaml): position limits, speeds, workspace, keep-out boxes")
        command.add_argument("--config", default=None, help="planning settings (default config/planning.yaml)")
        command.add_argument("--speed", type=float, default=None, metavar="RAD_S",
                             help="cap on every joint's speed (default: 0.8 of the envelope's limits)")
    sub.choices["check"].add_argument("--from", dest="start", default="home", metavar="START",
                                      help="'home' (default) or joint positions like GOAL's (--from=-0.6,... when "
                                      "negative first)")
    move = sub.choices["move"]
    move.add_argument("--topic", default="/twinloop/planning/command", help="an input of the envelope monitor")
    move.add_argument("--joint-states", default="/joint_states", help="measured joint states")
    move.add_argument("--timeout", type=float, default=10.0, help="s to wait for the monitor and the joint states")
    args = parser.parse_args(argv)
    try:
        return _check(args) if args.command == "check" else _move(args)
    except PlanningError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2 if error.code in BAD_INPUT_CODES else 4
    except (PlanningConfigError, TwinError, OSError, ValueError) as error:
        print(f"{PROG}: error: {one_line(error)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
