"""twinloop build: record identification sessions and build identified twin versions.

    twinloop build excite --kind joints --split fit [--duration 30]     # needs workcell, monitor, recorder
    twinloop build excite --kind pushes --split fit
    twinloop build build --fit BAG [BAG...] --held-out BAG [...] [--workcell emulated] [--root twins]
    twinloop build goal --fit BAG [BAG...] --held-out BAG [...]        # to the running twin_builder
    twinloop build goal --scan BAG [--calibration wrist.yaml]           # its geometry build, the same way
    twinloop build excite --kind scan --split fit                      # the wrist camera's views, held still
    twinloop build geometry --scan BAG [--root twins] [--calibration wrist.yaml]

`build` runs here, in this process (no ROS needed), with progress on stderr (overall
percentage and the time left at the rate so far, then the stage's own); `goal` sends
the same build to the running `twin_builder` node's ~/build action (progress on stderr,
Ctrl-C cancels it and nothing is written; its exit codes also include 3 the builder is not
running or busy, 4 it failed, 130 cancelled). `excite` sends its targets to
the envelope monitor (/twinloop/builder/command), arming it for each played trajectory. Exit status: 0 done, 2 bad
input (the message says what to do), 3 the workcell or recorder could not be reached.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time

from twinloop_twin.workcell import default_config_dir

EXCITATION_FILE = "excitation.yaml"
SCAN_TOPICS = ("/joint_states", "/wrist_camera/color/image_raw", "/wrist_camera/depth/image_rect_raw")


def _seconds(*, positive: bool):
    """An argparse type: a finite number of seconds, > 0 or >= 0."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number of seconds {'> 0' if positive else '>= 0'}; give e.g. 1.5")
        return value
    return parse


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1; give e.g. 12")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop build", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    excite = sub.add_parser("excite", help="play an excitation while the recorder records it")
    excite.add_argument("--kind", choices=("joints", "pushes", "scan"), default="joints",
                        help="pushes: the box pushed, then lifted (config/excitation.yaml pushes and lifts); "
                             "scan: the wrist camera's views of the table, held still, for `build geometry`")
    excite.add_argument("--split", choices=("fit", "held_out"), required=True)
    excite.add_argument("--duration", type=_seconds(positive=True), default=None, help="s, joint excitation length (default: file)")
    excite.add_argument("--seed", type=int, default=None, help="multi-sine seed (use another one for held-out)")
    excite.add_argument("--config", default=str(default_config_dir() / EXCITATION_FILE))
    excite.add_argument("--output-dir", default="", help="bag parent folder (default: the recorder's)")
    excite.add_argument("--twin", default="", help="twin version in use, stored with the session")
    excite.add_argument("--lead-in", type=_seconds(positive=False), default=1.0, help="s recorded at rest before the motion")
    excite.add_argument("--command-topic", default="/twinloop/builder/command",
                        help="where targets go: an input of the envelope monitor (config/envelope.yaml)")
    excite.add_argument("--monitor", default="/envelope_monitor",
                        help="envelope monitor armed for each played trajectory; '' only on a bench without one, "
                             "with --command-topic /joint_command")
    build = sub.add_parser("build", help="identify the physics and write the next twin version")
    build.add_argument("--fit", nargs="+", required=True, help="fit-split identification bags")
    build.add_argument("--held-out", nargs="*", default=[], help="held-out bags (scored, never fitted)")
    build.add_argument("--workcell", default="emulated")
    build.add_argument("--root", default="twins", help="twins folder")
    build.add_argument("--parent", type=int, default=None, help="parent version (default: the latest)")
    build.add_argument("--select", nargs="*", default=[], help="parameter name prefixes to identify (default: all)")
    build.add_argument("--max-iterations", type=_at_least_one, default=12,
                       help="optimizer iterations at most (>= 1)")
    build.add_argument("--residual", choices=("auto", "off"), default="auto",
                       help="auto: learn a joint-torque residual where the identified twin leaves a systematic "
                            "error (config/builder.yaml); off: never")
    goal = sub.add_parser("goal", help="send the build to the running twin_builder node (BuildTwin action)")
    goal.add_argument("--fit", nargs="+", default=[], help="fit-split identification bags")
    goal.add_argument("--scan", default="", help="instead of --fit: a scan bag, for a geometry build")
    goal.add_argument("--calibration", default="", help="with --scan: the wrist camera's eye-in-hand calibration")
    goal.add_argument("--held-out", nargs="*", default=[], help="held-out bags (scored, never fitted)")
    goal.add_argument("--workcell", default="", help="default: the builder's default_workcell")
    goal.add_argument("--parent", type=int, default=-1, help="parent version (default: the latest)")
    goal.add_argument("--select", nargs="*", default=[], help="parameter name prefixes to identify (default: all)")
    goal.add_argument("--builder", default="/twin_builder", help="node name of the twin builder")
    geometry = sub.add_parser("geometry", help="fuse a scan bag and write the next twin version with its geometry")
    geometry.add_argument("--scan", required=True, help="bag of `twinloop build excite --kind scan`")
    geometry.add_argument("--workcell", default="emulated")
    geometry.add_argument("--root", default="twins", help="twins folder")
    geometry.add_argument("--parent", type=int, default=None, help="parent version (default: the latest)")
    geometry.add_argument("--calibration", default=None,
                          help="eye-in-hand calibration of the wrist camera (default: the URDF mount)")
    geometry.add_argument("--voxel-mm", type=float, default=4.0, help="TSDF voxel size, mm")
    args = parser.parse_args(argv)
    if args.command == "build":
        return _build(args)
    if args.command == "geometry":
        return _geometry(args)
    if args.command == "goal":
        return _goal(args)
    return _excite(args)


def _build(args) -> int:
    from twinloop_builder.build import build_identified_twin
    from twinloop_builder.identification import IdentificationError, IdentificationSettings
    from twinloop_builder.progress import BuildProgress
    from twinloop_builder.recording import RecordingError
    from twinloop_twin.bundle import TwinError

    tracker = BuildProgress()

    def progress(stage: str, fraction: float, message: str) -> None:
        overall = tracker.update(stage, fraction)
        print(f"[{overall.elapsed_s:7.1f} s] {overall.describe()} | {fraction * 100:5.1f} % {stage}: {message}",
              file=sys.stderr, flush=True)

    try:
        built = build_identified_twin(args.root, args.workcell, args.fit, args.held_out, parent_version=args.parent,
                                      select=args.select, progress=progress, plan=tracker.plan,
                                      settings=IdentificationSettings(max_iterations=args.max_iterations,
                                                                      residual=args.residual))
    except (RecordingError, IdentificationError, TwinError) as error:
        # one line: a twin's list of mismatched files spans several
        print(f"twinloop build: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    print(format_result(built.result))
    if built.residual is not None:
        print(format_residual(built.residual))
    print(f"wrote {built.twin.path}")
    return 0


def _geometry(args) -> int:
    from twinloop_builder.geometry.from_scan import SCAN_ERRORS, ScanBuildSettings, build_geometry_from_scan
    from twinloop_twin.bundle import TwinError

    started = time.monotonic()

    def say(stage: str, fraction: float, message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f} s] {message}", file=sys.stderr, flush=True)

    if not (0.5 <= args.voxel_mm <= 50.0):
        print(f"twinloop build: --voxel-mm {args.voxel_mm} is outside 0.5-50 mm", file=sys.stderr)
        return 2
    try:
        built = build_geometry_from_scan(args.root, args.workcell, args.scan, calibration=args.calibration,
                                         parent_version=args.parent, progress=say,
                                         settings=ScanBuildSettings(voxel_size_m=args.voxel_mm / 1000.0))
    except (*SCAN_ERRORS, TwinError) as error:
        print(f"twinloop build: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    for line in built.summary():
        print(line)
    print(f"wrote {built.twin.path}")
    return 0


def _goal(args) -> int:
    from pathlib import Path

    from twinloop_ros.clients import BuildClient
    from twinloop_ros.command_line import CANCEL_WAIT, Progress, run_live

    if bool(args.fit) == bool(args.scan):
        print("twinloop build: give --fit BAG... (identify physics) or --scan BAG (build geometry), one of them",
              file=sys.stderr)
        return 2
    if args.scan and (args.held_out or args.select):
        print("twinloop build: --held-out and --select belong to a physics build (--fit); a --scan goal builds "
              "geometry only", file=sys.stderr)
        return 2
    if args.calibration and not args.scan:
        print("twinloop build: --calibration goes with --scan (the wrist camera's pose for the scan)", file=sys.stderr)
        return 2

    def body(session) -> int:
        progress = Progress()
        if args.scan:
            result = BuildClient(session.node, builder=args.builder).build_geometry(
                str(Path(args.scan).resolve()), calibration=str(Path(args.calibration).resolve()) if args.calibration
                else "", workcell=args.workcell, parent_version=args.parent,
                on_feedback=lambda f: progress(f"{f.progress * 100:5.1f} % {f.stage}: {f.message}"))
            for line in result.summary:
                print(line)
            print(f"wrote {result.twin_path} (v{result.version})")
            return 0
        # Bag paths as the node (another working directory) must read them.
        result = BuildClient(session.node, builder=args.builder).build(
            [str(Path(b).resolve()) for b in args.fit], [str(Path(b).resolve()) for b in args.held_out],
            workcell=args.workcell, parent_version=args.parent, parameters=args.select,
            on_feedback=lambda f: progress(f"{f.progress * 100:5.1f} % {f.stage}: {f.message}"),
            # the builder stops at the optimizer's next iteration, which can take a while
            cancel_wait_s=300.0, on_cancel=lambda: progress(CANCEL_WAIT.format(node="the twin builder")))
        if args.held_out:
            print(f"held-out joint RMSE: parent version {result.held_out_rmse_before * 1e3:.3f} mrad -> identified "
                  f"{result.held_out_rmse_after * 1e3:.3f} mrad")
        missing = list(result.not_identifiable)
        print(f"not identifiable: {', '.join(missing) or 'none'}" if len(missing) <= 6 else
              f"not identifiable: {len(missing)} parameters ({', '.join(missing[:3])}, ...); the reasons are in "
              f"{result.twin_path}/identification/report.yaml")
        print(f"wrote {result.twin_path} (v{result.version})")
        return 0

    return run_live("twinloop build", body)


def format_result(result) -> str:
    lines = [f"{'parameter':42s} {'mean':>11s} {'std':>10s}  {'95% interval':>25s}  identifiable"]
    for name, e in result.estimates.items():
        interval = f"[{e.ci_low:.4g}, {e.ci_high:.4g}]" if e.ci_low == e.ci_low else "-"
        lines.append(f"{name:42s} {e.mean:11.5g} {e.std:10.3g}  {interval:>25s}  {'yes' if e.identifiable else 'NO'}")
    lines.append(f"held-out joint RMSE: parent version {result.held_out_rmse_before_rad * 1e3:.3f} mrad -> identified "
                 f"{result.held_out_rmse_after_rad * 1e3:.3f} mrad")
    lines += [f"guidance: {g}" for g in result.guidance]
    return "\n".join(lines)


def format_residual(outcome) -> str:
    lines = [f"residual: {outcome.reason}"]
    first = outcome.load_note.get("held_out_rmse_mrad_without_it")
    if outcome.weights is not None and outcome.held_out_per_joint and first is not None:
        lines.append(f"held-out joint RMSE: identified {first:.3f} mrad, identified with the load "
                     f"{outcome.held_out_before_rad * 1e3:.3f}, with the residual's networks beside it "
                     f"{outcome.held_out_after_rad * 1e3:.3f} (noise floor {outcome.noise_floor_rad * 1e3:.3f})")
    elif outcome.weights is not None and outcome.held_out_per_joint:
        lines.append(f"held-out joint RMSE with the residual: {outcome.held_out_before_rad * 1e3:.3f} -> "
                     f"{outcome.held_out_after_rad * 1e3:.3f} mrad (noise floor {outcome.noise_floor_rad * 1e3:.3f})")
    return "\n".join(lines)


def _motion_checks(workcell):
    """(plan_move, envelope_problem) on the workcell's scene and the envelope
    (config/envelope.yaml): the motion planner's move (to a trajectory's start, between scan
    views; targets at the envelope's command period), and why the envelope monitor would
    fault a trajectory (checked before it is sent)."""
    import numpy as np

    from twinloop_planning.planner import PlanningError, monitor_problem, plan_from_measured
    from twinloop_planning.scene import PlanningScene

    scene = PlanningScene.from_workcell(workcell)

    def plan_move(here, first):
        try:
            return plan_from_measured(here, first, scene).positions
        except PlanningError as error:
            raise ValueError(str(error)) from error

    def envelope_problem(trajectory) -> str | None:
        period = float(trajectory.t[1] - trajectory.t[0]) if len(trajectory.t) > 1 else scene.limits.command_period_s
        return monitor_problem(np.asarray(trajectory.positions), trajectory.joints, scene, period)
    return plan_move, envelope_problem


def _excite(args) -> int:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    import threading

    from twinloop_builder.excitation import (ExcitationError, WorkspaceChecker, joint_excitation,
                                             lift_trajectory, load_excitation_config, motion_limits, push_trajectory,
                                             scan_trajectory)
    from twinloop_builder.player_node import (ExcitationMonitor, ExcitationPlayer, IdentificationRecorder,
                                              PlayerError, joint_ranges)
    from twinloop_twin.physics import load_physics
    from twinloop_twin.scene import compile_workcell
    from twinloop_twin.workcell import load_workcell

    try:
        config = load_excitation_config(args.config)
    except ExcitationError as error:
        print(f"twinloop build: {error}", file=sys.stderr)
        return 2
    joints = config.joints
    if args.duration is not None:
        joints = dataclasses.replace(joints, duration_s=args.duration)
    if args.seed is not None:
        joints = dataclasses.replace(joints, seed=args.seed)
    workcell = load_workcell()
    model = compile_workcell(workcell, load_physics(default_config_dir() / "nominal_physics.yaml"))
    try:
        if args.kind == "joints":
            trajectory = joint_excitation(joints, workcell.home_joint_positions, model, workcell.urdf_xml,
                                          workcell.table_top_height_m)
        elif args.kind == "scan":
            max_speed, max_acceleration = motion_limits(joints, workcell.urdf_xml)
            trajectory = scan_trajectory(workcell.home_joint_positions, WorkspaceChecker(model, workcell.table_top_height_m),
                                         max_speed=max_speed, max_acceleration=max_acceleration,
                                         command_rate_hz=joints.command_rate_hz,
                                         plan_move=_motion_checks(workcell)[0])
        else:
            trajectory = None
    except ExcitationError as error:
        print(f"twinloop build: {error}", file=sys.stderr)
        return 2
    rclpy.init()
    node = rclpy.create_node("twinloop_excitation")
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [executor.spin_once(timeout_sec=0.05) for _ in iter(stop.is_set, True)],
                               daemon=True)
    spinner.start()
    code = 0
    try:
        limits = motion_limits(joints, workcell.urdf_xml)
        plan_move, envelope_problem = _motion_checks(workcell)
        player = ExcitationPlayer(node, command_topic=args.command_topic, limits=limits,
                                  position_range=joint_ranges(model), pause_lead=joints.pause_lead,
                                  max_pause_s=joints.max_pause_s, plan_move=plan_move)
        recorder = IdentificationRecorder(node)
        monitor = ExcitationMonitor(node, args.monitor) if args.monitor else None

        def play(trajectory, what: str, *, skippable: bool = False) -> None:
            lead = player.lead_in(trajectory)  # planned while the monitor is disarmed
            # Checked before it is sent: what the monitor would fault is not streamed.
            problem = envelope_problem(lead.then(trajectory) if lead is not None else trajectory)
            if problem is not None:
                if not skippable:
                    raise ExcitationError(f"{what}: {problem}; nothing was sent")
                print(f"{what}: skipped, not sent: {problem} (the box is out of its reach from where it lies)",
                      file=sys.stderr)
                return
            # Armed right before the first target and disarmed as the stream ends: the
            # monitor's command watchdog faults on an armed stream that stops.
            if monitor:
                monitor.check(f"before {what}")
                monitor.set_armed(True)
            try:
                lead_s = player.play(trajectory, stop=monitor.faulted if monitor else lambda: False, lead=lead)
                if lead_s:
                    print(f"{what}: first {lead_s:.2f} s from the measured pose to its start", file=sys.stderr)
                if monitor and monitor.faulted():
                    # which side paused: this sender (a long gap here) or the way to the monitor
                    print(f"{what}: longest time between two published commands {player.longest_gap_s * 1e3:.0f} ms",
                          file=sys.stderr)
                if player.pauses_s:
                    print(f"{what}: held {len(player.pauses_s)} times ({sum(player.pauses_s):.2f} s in all, longest "
                          f"{max(player.pauses_s):.2f} s) while the robot lagged its target by more than pause_lead ("
                          + ", ".join(f"{j} {n}x" for j, n in player.lagging.most_common()) + ")",
                          file=sys.stderr)
            finally:
                if monitor:
                    asked = time.monotonic()
                    with player.holding():  # the stream stays alive until the monitor has disarmed
                        monitor.set_armed(False)
                    took = time.monotonic() - asked
                    if took > joints.max_pause_s:
                        print(f"{what}: disarming the monitor took {took:.2f} s (the last "
                              "target was sent again meanwhile: the command watchdog faults a silent stream)",
                              file=sys.stderr)
            if monitor:
                monitor.check(what)
            print(f"played {what} ({trajectory.t[-1]:.1f} s)", file=sys.stderr)

        scan = args.kind == "scan"
        bag = recorder.start(split=args.split, output_dir=args.output_dir, twin_version=args.twin,
                             note=f"twinloop build excite --kind {args.kind}", profile="scan" if scan else "identification",
                             **({"required_topics": SCAN_TOPICS, "timeout_s": 20.0} if scan else {}))
        print(f"recording {bag}", file=sys.stderr)
        try:
            time.sleep(args.lead_in)  # at rest: the identification starts from a still robot
            if trajectory is not None:
                play(trajectory, "the scan" if scan else "the joint excitation")
            else:
                checker = WorkspaceChecker(model, workcell.table_top_height_m)
                max_speed, max_acceleration = limits
                for index, push in enumerate(config.pushes):
                    path = push_trajectory(push, player.wait_for_box(), workcell.box.size_m[0] / 2,
                                           workcell.home_joint_positions, checker, max_speed=max_speed,
                                           max_acceleration=max_acceleration, command_rate_hz=joints.command_rate_hz)
                    if path.slowed > 1.0:
                        print(f"push {index}: {push.speed_m_s / path.slowed:.2f} m/s instead of {push.speed_m_s} "
                              "(joint speed/acceleration limits)", file=sys.stderr)
                    play(path, f"push {index}", skippable=True)
                for index, lift in enumerate(config.lifts):
                    path = lift_trajectory(lift, player.wait_for_box(), workcell.box.size_m[0] / 2,
                                           workcell.home_joint_positions, checker, max_speed=max_speed,
                                           max_acceleration=max_acceleration, command_rate_hz=joints.command_rate_hz)
                    play(path, f"lift {index}", skippable=True)
            time.sleep(0.5)
        finally:
            recorder.stop()
        print(bag)
    except (PlayerError, ExcitationError) as error:
        print(f"twinloop build: {error}", file=sys.stderr)
        code = 3 if isinstance(error, PlayerError) else 2
    finally:
        stop.set()
        spinner.join(timeout=2.0)
        node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
