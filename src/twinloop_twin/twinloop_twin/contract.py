"""The hardware contract of design.md as data, and the checks every boundary applies.

Pure Python (no rclpy): the emulated workcell, the sim bridge and the tests share it.
Joint-name and ordering checks live here because a command whose names do not match
the robot is the most common sim-to-real bug; it is refused, never guessed at.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence


@dataclass(frozen=True)
class ContractTopics:
    """Default topic names of a workcell (ros2_control / realsense-ros conventions)."""

    joint_states: str = "/joint_states"
    joint_command: str = "/joint_command"
    robot_description: str = "/robot_description"
    tf: str = "/tf"
    tf_static: str = "/tf_static"
    clock: str = "/clock"
    wrench: str = "/wrench"

    @staticmethod
    def camera(camera: str) -> dict[str, str]:
        """Image topics of one RGB-D camera, realsense-ros style (`/<camera>/...`)."""
        return {
            "color": f"/{camera}/color/image_raw",
            "color_info": f"/{camera}/color/camera_info",
            "depth": f"/{camera}/depth/image_rect_raw",
            "depth_info": f"/{camera}/depth/camera_info",
        }


# Topics a simulated workcell adds under /twinloop/<node>/ (so that the recording profiles
# keep them); a real driver has neither. Each accepted command, stamped with the physics
# time it took effect at (a recorder's receive time can be ms off on a loaded host):
APPLIED_COMMAND_SUFFIX = "/applied_command"
# The box's ground-truth pose (a simulator's; tests and benchmarks score stages with it):
BOX_POSE_SUFFIX = "/box_pose"
# The box's pose as the cameras see it (twinloop_perception's box tracker,
# geometry_msgs/PoseWithCovarianceStamped): what the loop's stages read, on any workcell.
TRACKED_BOX_POSE_TOPIC = "/twinloop/perception/box_pose"


def simulated_topic(topics: Mapping[str, int], suffix: str) -> str | None:
    """The first `/twinloop/.../<suffix>` topic with messages, from {topic: message count}
    (never the tracked box pose: it is measured, not simulated)."""
    return next((t for t in sorted(topics) if t.startswith("/twinloop/") and t.endswith(suffix) and topics[t] > 0
                 and t != TRACKED_BOX_POSE_TOPIC), None)


class CommandRejected(ValueError):
    """A joint command that must not reach the actuators. `code` is an ErrorCode name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def parse_joint_command(names: Sequence[str], positions: Sequence[float],
                        commandable: Sequence[str]) -> dict[str, float]:
    """Validate a position command and return {joint: target}.

    A command may name any subset of the commandable joints (as topic_based_ros2_control
    accepts), in any order; joints it does not name keep their previous target.
    """
    names = list(names)
    positions = list(positions)
    if not names:
        raise CommandRejected("MALFORMED_COMMAND",
                              "joint command names no joint: fill JointState.name with the "
                              f"joints to move (commandable: {', '.join(commandable)})")
    if len(positions) != len(names):
        raise CommandRejected("MALFORMED_COMMAND",
                              f"joint command has {len(names)} names but {len(positions)} "
                              "positions: send one position target per named joint")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CommandRejected("MALFORMED_COMMAND",
                              f"joint command names {duplicates} more than once: name each joint once")
    unknown = [n for n in names if n not in commandable]
    if unknown:
        raise CommandRejected("UNKNOWN_JOINT",
                              f"joint command names unknown joint(s) {unknown}; this robot's "
                              f"commandable joints are {list(commandable)}. Check the joint-name "
                              "mapping of the sender (prefixes, ordering, simulator naming).")
    bad = [n for n, p in zip(names, positions) if not math.isfinite(p)]
    if bad:
        raise CommandRejected("NON_FINITE_COMMAND",
                              f"joint command has non-finite targets for {bad}: the command is "
                              "dropped and the previous targets are held; fix the sender")
    return {n: float(p) for n, p in zip(names, positions)}


def check_joint_order(expected: Sequence[str], received: Sequence[str]) -> None:
    """Raise CommandRejected unless `received` holds exactly the `expected` joints."""
    missing = [n for n in expected if n not in received]
    extra = [n for n in received if n not in expected]
    if missing or extra:
        raise CommandRejected("UNKNOWN_JOINT",
                              f"joint names do not match the robot: missing {missing}, unexpected {extra}")


def clamp_to_limits(targets: Mapping[str, float],
                    limits: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Clamp targets into the joints' position ranges, as a real joint controller does."""
    return {n: min(max(p, limits[n][0]), limits[n][1]) if n in limits else p
            for n, p in targets.items()}
