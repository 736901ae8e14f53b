"""The twinloop stack's node set, declared once.

`launch/stack.launch.py` builds its `launch_ros` Nodes from `STACK`, and `twinloop bringup`
(the launch-free bring-up of the PyPI wheels) starts the same nodes, each in a process of
its own with the same parameter files, so both bring-ups are the same node set.

Every node runs in its own process: the envelope monitor is the safety-critical node, and
sharing a Python process (one GIL, one executor) with the recorder's disk writes or the
calibration server's image processing delays its command and joint-state callbacks by
tens of milliseconds, which it reads as a stalled or jumping command stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StackNode:
    """One node of the stack.

    `package`/`executable`: what `ros2 launch` runs. `module`: the Python module the
    launch-free bring-up runs instead (`python -m module`); differs only where a ROS 2
    install offers a C++ node the wheels lack (robot_state_publisher).
    """

    name: str
    package: str
    executable: str
    module: str
    params_file: str | None = None  # config/<file>; None: the node's declared defaults
    parameters: dict[str, object] = field(default_factory=dict)
    remappings: tuple[tuple[str, str], ...] = ()
    fallback_parameters: dict[str, object] = field(default_factory=dict)  # for `module` only
    description: str = ""


STACK: tuple[StackNode, ...] = (
    StackNode("recorder", "twinloop_logging", "recorder", "twinloop_logging.recorder_node", "recorder.yaml",
              description="topics to rosbag2 MCAP with session metadata and drop accounting"),
    StackNode("envelope_monitor", "twinloop_safety", "envelope_monitor", "twinloop_safety.envelope_monitor_node",
              "envelope.yaml", description="the only writer of /joint_command"),
    StackNode("policy_runner", "twinloop_policy", "policy_runner", "twinloop_policy.policy_runner_node",
              "policy_runner.yaml", description="runs exported policies and recorded trials"),
    StackNode("calibration_server", "twinloop_calibration", "calibration_server",
              "twinloop_calibration.calibration_server_node", "calibration.yaml",
              description="hand-eye calibration action"),
    StackNode("box_tracker", "twinloop_perception", "box_tracker", "twinloop_perception.box_tracker_node",
              "box_tracker.yaml", description="the box's pose from the static camera (what identification reads)"),
    StackNode("twin_builder", "twinloop_builder", "twin_builder", "twinloop_builder.twin_builder_node", None,
              description="physics identification into new twin versions (build action)"),
    StackNode("replay_server", "twinloop_sim", "replay_server", "twinloop_sim.replay_node", None,
              description="replays recorded runs in a twin; publishes the ghost's joint states"),
    # The twin's predicted robot as a translucent ghost in RViz (frames prefixed ghost/).
    StackNode("ghost_state_publisher", "robot_state_publisher", "robot_state_publisher",
              "twinloop_sim.state_publisher_node", None,
              parameters={"frame_prefix": "ghost/"}, fallback_parameters={"root_frame_parent": "world"},
              remappings=(("joint_states", "/twinloop/sim/joint_states"),
                          ("robot_description", "/ghost_state_publisher/robot_description")),
              description="the twin's predicted robot for RViz"),
)

NODE_NAMES = tuple(node.name for node in STACK)
# The nodes that read the envelope monitor's parameter file: the monitor itself (its params
# file) and those that plan within its limits (their `envelope_config` parameter). A
# bring-up given another envelope file passes it to all of them.
ENVELOPE_READERS = ("policy_runner", "calibration_server")


def stack_nodes(without: list[str] | tuple[str, ...] = ()) -> list[StackNode]:
    """The stack minus the named nodes; an unknown name is an error that lists the known ones."""
    unknown = sorted(set(without) - set(NODE_NAMES))
    if unknown:
        raise ValueError(f"unknown node(s) {', '.join(unknown)}; the stack has: {', '.join(NODE_NAMES)}")
    return [node for node in STACK if node.name not in without]
