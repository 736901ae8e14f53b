"""Plays excitation trajectories on a workcell through /joint_command while the recorder
records an identification session. Helpers that attach to a node (no node of its own).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from twinloop_interfaces.msg import ErrorCode, SessionId
from twinloop_interfaces.srv import StartRecording, StopRecording

from twinloop_builder.excitation import JointTrajectory

# Commands are RELIABLE: a lost target would be a step the identification never sees.
COMMAND_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)


class PlayerError(RuntimeError):
    """The session could not be played or recorded; the message says what to check."""


@dataclass
class RecordedSession:
    bag_path: str
    session_id: str
    duration_s: float


class ExcitationPlayer:
    """Publishes JointTrajectory rows on /joint_command at their times (wall clock)."""

    def __init__(self, node: Node, *, command_topic: str = "/joint_command",
                 box_topic: str = "/twinloop/emulated_workcell/box_pose") -> None:
        self.node = node
        self.publisher = node.create_publisher(JointState, command_topic, COMMAND_QOS)
        self.box_xyz: np.ndarray | None = None
        # In reality the box pose would come from perception; the emulated workcell publishes its truth.
        node.create_subscription(PoseStamped, box_topic, self._on_box, 10)

    def _on_box(self, msg: PoseStamped) -> None:
        p = msg.pose.position
        self.box_xyz = np.array([p.x, p.y, p.z])

    def play(self, trajectory: JointTrajectory) -> None:
        start = time.monotonic()
        names = list(trajectory.joints)
        for t, row in zip(trajectory.t, trajectory.positions):
            delay = start + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            msg = JointState(name=names, position=[float(v) for v in row])
            msg.header.stamp = self.node.get_clock().now().to_msg()
            self.publisher.publish(msg)

    def wait_for_box(self, timeout_s: float = 5.0) -> np.ndarray:
        deadline = time.monotonic() + timeout_s
        while self.box_xyz is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.box_xyz is None:
            raise PlayerError("no box pose received: is the workcell (or the box perception) running?")
        return self.box_xyz.copy()


class RecorderClient:
    """Starts and stops a session of the twinloop recorder (`/recorder/start`, `/recorder/stop`)."""

    def __init__(self, node: Node, recorder: str = "/recorder") -> None:
        self.node = node
        self.start_client = node.create_client(StartRecording, f"{recorder}/start")
        self.stop_client = node.create_client(StopRecording, f"{recorder}/stop")

    def _call(self, client, request, timeout_s: float):
        if not client.wait_for_service(timeout_sec=timeout_s):
            raise PlayerError(f"service {client.srv_name} is not available: start the recorder "
                              "(python -m twinloop_logging.recorder_node)")
        future = client.call_async(request)
        deadline = time.monotonic() + timeout_s
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        if not future.done():
            raise PlayerError(f"{client.srv_name} did not answer within {timeout_s} s")
        response = future.result()
        if response.error.code != ErrorCode.NONE:
            raise PlayerError(f"{client.srv_name}: {response.error.message}")
        return response

    def start(self, *, split: str, output_dir: str = "", note: str = "", twin_version: str = "",
              timeout_s: float = 10.0) -> str:
        request = StartRecording.Request(profile="identification", output_dir=output_dir, operator_note=note,
                                         twin_version=twin_version)
        request.session = SessionId(purpose=SessionId.PURPOSE_IDENTIFICATION, split=split)
        return self._call(self.start_client, request, timeout_s).bag_path

    def stop(self, timeout_s: float = 20.0) -> str:
        return self._call(self.stop_client, StopRecording.Request(), timeout_s).bag_path
