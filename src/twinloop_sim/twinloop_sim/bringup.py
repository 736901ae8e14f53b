"""twinloop-bringup: the embedded default's node set where ROS 2 `launch` is not installed.

    twinloop-bringup                      # emulated workcell + the twinloop stack, Ctrl-C stops all
    twinloop-bringup --without policy_runner calibration_server

This is not a launch system: it starts the emulated workcell in its own process (the
hardware stand-in keeps its real-time physics loop to itself) and instantiates the other
nodes' classes in one process on one executor, with the same parameter files the launch
files use (`config/<node>.yaml`, passed as `--params-file` exactly as `ros2 launch` would).
On a ROS 2 install use `ros2 launch twinloop_sim emulated.launch.py` instead.
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import rclpy
from rclpy.executors import MultiThreadedExecutor
from rclpy.signals import SignalHandlerOptions

from twinloop_sim.testing import NodeProcess
from twinloop_twin.workcell import default_config_dir


@dataclass(frozen=True)
class StackNode:
    name: str
    module: str
    node_class: str
    params_file: str | None  # config/<file>, None: the node's declared defaults
    overrides: tuple[tuple[str, str], ...] = ()


# The same set as launch/emulated.launch.py, minus the workcell (its own process) and RViz.
STACK = (
    StackNode("recorder", "twinloop_logging.recorder_node", "Recorder", "recorder.yaml"),
    StackNode("envelope_monitor", "twinloop_safety.envelope_monitor_node", "EnvelopeMonitorNode", "envelope.yaml"),
    StackNode("policy_runner", "twinloop_policy.policy_runner_node", "PolicyRunnerNode", "policy_runner.yaml"),
    StackNode("calibration_server", "twinloop_calibration.calibration_server_node", "CalibrationServer",
              "calibration.yaml"),
    StackNode("replay_server", "twinloop_sim.replay_node", "ReplayServer", None),
    StackNode("ghost_state_publisher", "twinloop_sim.state_publisher_node", "StatePublisher", None,
              (("joint_states_topic", "/twinloop/sim/joint_states"), ("frame_prefix", "ghost/"),
               ("root_frame_parent", "world"))),
)


def ros_arguments(nodes: list[StackNode], config_dir: Path) -> list[str]:
    """--ros-args for one context holding all nodes: parameter files and per-node overrides."""
    args = ["--ros-args"]
    for node in nodes:
        if node.params_file:
            args += ["--params-file", str(config_dir / node.params_file)]
    return args


def instantiate(node: StackNode):
    cls = getattr(importlib.import_module(node.module), node.node_class)
    if node.node_class == "StatePublisher" and node.name != "state_publisher":
        return _renamed(cls, node)
    return cls()


def _renamed(cls, node: StackNode):
    """A second instance of a node class under another name with its own overrides."""
    from rclpy.parameter import Parameter

    instance = cls.__new__(cls)
    original_init = rclpy.node.Node.__init__

    def init(self, _name, **kwargs):
        overrides = [Parameter(k, value=v) for k, v in node.overrides]
        original_init(self, node.name, parameter_overrides=overrides, **kwargs)
    rclpy.node.Node.__init__ = init
    try:
        cls.__init__(instance)
    finally:
        rclpy.node.Node.__init__ = original_init
    return instance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop-bringup", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--truth-file", default="", help="hidden physics of the emulated workcell")
    parser.add_argument("--without", nargs="*", default=[], help="nodes of the stack not to start")
    parser.add_argument("--no-workcell", action="store_true", help="the workcell runs elsewhere (a robot)")
    parser.add_argument("--log-dir", default="log/bringup")
    args = parser.parse_args(argv)
    config_dir = default_config_dir()
    nodes = [n for n in STACK if n.name not in args.without]
    workcell = None
    if not args.no_workcell:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
        parameters = {"truth_file": args.truth_file} if args.truth_file else {}
        workcell = NodeProcess("twinloop_sim.emulated_workcell_node", _domain_id(), parameters,
                               log_path=Path(args.log_dir) / "emulated_workcell.log",
                               extra_args=["--params-file", str(config_dir / "emulated_workcell.yaml")])
        print(f"[bringup] emulated workcell started (log: {workcell.log_path})", flush=True)
    stop = threading.Event()
    rclpy.init(args=ros_arguments(nodes, config_dir), signal_handler_options=SignalHandlerOptions.NO)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    started = []
    executor = MultiThreadedExecutor(num_threads=4)
    try:
        for node in nodes:
            started.append(instantiate(node))
            executor.add_node(started[-1])
            print(f"[bringup] {node.name} up", flush=True)
        print(f"[bringup] {len(started)} nodes running; Ctrl-C stops them", flush=True)
        while rclpy.ok() and not stop.is_set():
            executor.spin_once(timeout_sec=0.1)
    finally:
        executor.shutdown()
        for node in started:
            node.destroy_node()
        rclpy.try_shutdown()
        if workcell is not None:
            workcell.stop()
    return 0


def _domain_id() -> int:
    import os
    return int(os.environ.get("ROS_DOMAIN_ID", "0"))


if __name__ == "__main__":
    sys.exit(main())
