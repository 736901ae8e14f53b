"""twinloop bringup: the embedded default's node set where ROS 2 `launch` is not installed.

    twinloop bringup                      # emulated workcell + the twinloop stack, Ctrl-C stops all
    twinloop bringup --without policy_runner calibration_server
    twinloop bringup --no-workcell        # a robot driver provides the hardware contract
    twinloop bringup --envelope my_envelope.yaml   # the monitor's limits, workspace and keep-out boxes
    twinloop bringup --tracker-calibration calibration/emulated/static_camera.yaml

Not a launch system, but the same node set as `launch/emulated.launch.py`
(`twinloop_bringup.node_set`), each node in a process of its own with the parameter files
the launch files pass (`config/<node>.yaml`). On a ROS 2 install use
`ros2 launch twinloop_bringup emulated.launch.py` instead.

Exit codes: 0 stopped by Ctrl-C/SIGTERM, 2 bad arguments, 3 a node exited on its own
(its log is named).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from twinloop_bringup.node_set import ENVELOPE_READERS, NODE_NAMES, StackNode, stack_nodes
from twinloop_ros.process import NodeProcess
from twinloop_twin.workcell import default_config_dir

EXIT_BAD_ARGUMENTS = 2
EXIT_NODE_DIED = 3


def node_process(node: StackNode, domain_id: int, config_dir: Path, log_dir: Path,
                 envelope: Path | None = None, tracker_calibration: Path | None = None) -> NodeProcess:
    """Start one node of the stack as `ros2 launch` would: its name, parameter file, overrides,
    remaps. `envelope`: the monitor's parameter file instead of config/envelope.yaml (and the
    `envelope_config` of the nodes that plan within it). `tracker_calibration`: the box
    tracker's camera pose from this eye-to-hand calibration instead of the URDF mount."""
    extra = ["-r", f"__node:={node.name}"]
    if node.params_file:
        params_file = envelope if envelope is not None and node.params_file == "envelope.yaml" else \
            config_dir / node.params_file
        extra += ["--params-file", str(params_file)]
    for source, target in node.remappings:
        extra += ["-r", f"{source}:={target}"]
    parameters = {**node.parameters, **node.fallback_parameters}
    if envelope is not None and node.name in ENVELOPE_READERS:
        parameters["envelope_config"] = str(envelope)
    if tracker_calibration is not None and node.name == "box_tracker":
        parameters["calibration_file"] = str(tracker_calibration)
    return NodeProcess(node.module, domain_id, parameters, log_path=log_dir / f"{node.name}.log", extra_args=extra)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="twinloop bringup")
    parser.description = __doc__
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--truth-file", default="", help="hidden physics of the emulated workcell")
    parser.add_argument("--without", nargs="*", default=[], metavar="NODE",
                        help=f"nodes of the stack not to start ({', '.join(NODE_NAMES)})")
    parser.add_argument("--no-workcell", action="store_true", help="the workcell runs elsewhere (a robot)")
    parser.add_argument("--log-dir", default="log/bringup", help="one log file per node")
    parser.add_argument("--envelope", default="", metavar="FILE",
                        help="the envelope monitor's parameter file (default config/envelope.yaml); the policy "
                        "runner's resets and the calibration server's poses are planned within it too")
    parser.add_argument("--tracker-calibration", default="", metavar="FILE",
                        help="an eye-to-hand calibration of the box tracker's camera (written by `twinloop calibrate`): "
                        "the tracker places the camera by it (default: the URDF mount)")
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        nodes = stack_nodes(args.without)
    except ValueError as error:
        print(f"twinloop bringup: {error}", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    if args.truth_file and not Path(args.truth_file).is_file():
        print(f"twinloop bringup: truth file {args.truth_file} not found; give an existing physics YAML "
              "(e.g. config/emulated_truth.yaml)", file=sys.stderr)
        return EXIT_BAD_ARGUMENTS
    if args.truth_file:  # checked here, so that a bad file is one line before any node starts
        from twinloop_twin.physics import PhysicsConfigError
        from twinloop_twin.scene import load_truth
        from twinloop_twin.workcell import load_workcell

        try:
            load_truth(args.truth_file, load_workcell())
        except PhysicsConfigError as error:
            print(f"twinloop bringup: --truth-file: {error}", file=sys.stderr)
            return EXIT_BAD_ARGUMENTS
    envelope = Path(args.envelope).resolve() if args.envelope else None
    if envelope is not None:
        from twinloop_safety.envelope import EnvelopeConfigError, load_envelope_limits
        from twinloop_twin.kinematics import UrdfTransforms
        from twinloop_twin.workcell import load_workcell

        try:
            load_envelope_limits(envelope, UrdfTransforms(load_workcell().urdf_xml))
        except (EnvelopeConfigError, OSError, ValueError) as error:
            hint = "" if "config/envelope.yaml" in str(error) else "; give a file like config/envelope.yaml"
            print(f"twinloop bringup: --envelope {args.envelope}: {error}{hint}", file=sys.stderr)
            return EXIT_BAD_ARGUMENTS
    tracker_calibration = Path(args.tracker_calibration).resolve() if args.tracker_calibration else None
    if tracker_calibration is not None:
        from twinloop_calibration.calibration_io import CalibrationFileError, read_camera_mount

        try:
            read_camera_mount(tracker_calibration, "eye_to_hand")
        except CalibrationFileError as error:
            print(f"twinloop bringup: --tracker-calibration: {error}", file=sys.stderr)
            return EXIT_BAD_ARGUMENTS
    config_dir = default_config_dir()
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    domain = int(os.environ.get("ROS_DOMAIN_ID", "0") or 0)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    started: list[tuple[str, NodeProcess]] = []
    code = 0
    try:
        if not args.no_workcell:
            parameters = {"truth_file": args.truth_file} if args.truth_file else {}
            started.append(("emulated_workcell", NodeProcess(
                "twinloop_sim.emulated_workcell_node", domain, parameters,
                log_path=log_dir / "emulated_workcell.log",
                extra_args=["--params-file", str(config_dir / "emulated_workcell.yaml")])))
            print(f"[bringup] emulated_workcell started (log: {log_dir / 'emulated_workcell.log'})", flush=True)
        for node in nodes:
            started.append((node.name, node_process(node, domain, config_dir, log_dir, envelope, tracker_calibration)))
            print(f"[bringup] {node.name} started (log: {log_dir / (node.name + '.log')})", flush=True)
        print(f"[bringup] {len(started)} nodes running on ROS domain {domain}, one process each; "
              "Ctrl-C stops them", flush=True)
        while not stop.is_set():
            dead = [(name, p) for name, p in started if p.process.poll() is not None]
            if dead:
                name, process = dead[0]
                print(f"[bringup] ERROR: {name} exited with code {process.process.returncode}; "
                      f"see {process.log_path}", file=sys.stderr, flush=True)
                code = EXIT_NODE_DIED
                break
            stop.wait(0.2)
    finally:
        # Stop the stack before the workcell, so nothing commands a robot that is going away.
        for _, process in reversed(started):
            if process.process.poll() is None:
                process.process.send_signal(signal.SIGINT)
        for _, process in reversed(started):
            process.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print("[bringup] stopped", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
