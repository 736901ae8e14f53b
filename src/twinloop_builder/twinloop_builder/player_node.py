"""Plays excitation trajectories on a workcell through the envelope monitor while the
recorder records an identification session. Helpers that attach to a node (no node of
its own) that another thread spins.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping

import numpy as np
from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from sensor_msgs.msg import JointState
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode, RecordingStatus, SessionId
from twinloop_interfaces.srv import SetArmed, StartRecording, StopRecording
from twinloop_twin.contract import APPLIED_COMMAND_SUFFIX, BOX_POSE_SUFFIX
from twinloop_ros.clients import not_yet_recorded
from twinloop_ros.qos import COMMANDS, LATCHED, SENSOR

from twinloop_builder.excitation import JointTrajectory, approach

# What an identification bag cannot do without, from its first message on.
REQUIRED_TOPICS = ("/joint_states", "/joint_command")


class PlayerError(RuntimeError):
    """The session could not be played or recorded; the message says what to check."""


@dataclass
class RecordedSession:
    bag_path: str
    session_id: str
    duration_s: float


class ExcitationPlayer:
    """Publishes JointTrajectory rows on a command topic at their times (wall clock): the
    envelope monitor's input on a workcell, /joint_command itself only on a bench without one."""

    def __init__(self, node: Node, *, command_topic: str = "/twinloop/builder/command",
                 box_topic: str = "/twinloop/emulated_workcell/box_pose", joint_states_topic: str = "/joint_states",
                 limits: tuple[Mapping[str, float], Mapping[str, float]] | None = None) -> None:
        self.node = node
        self.publisher = node.create_publisher(JointState, command_topic, COMMANDS)
        self.box_xyz: np.ndarray | None = None
        # (speed, acceleration) limits: with them, play() first moves from the measured
        # position to the trajectory's start (see excitation.approach).
        self.limits = limits
        self.measured: dict[str, float] = {}
        node.create_subscription(JointState, joint_states_topic,
                                 lambda msg: self.measured.update(zip(msg.name, msg.position)),
                                 SENSOR)
        # In reality the box pose would come from perception; the emulated workcell publishes its truth.
        node.create_subscription(PoseStamped, box_topic, self._on_box, 10)

    def _on_box(self, msg: PoseStamped) -> None:
        p = msg.pose.position
        self.box_xyz = np.array([p.x, p.y, p.z])

    def play(self, trajectory: JointTrajectory, stop=lambda: False) -> float:
        """Publish the rows at their times; ends early once `stop()` is true (a monitor fault).
        Returns how long the move from the measured pose to the start took (0: none needed)."""
        lead = None
        if self.limits is not None:
            lead = approach(dict(self.measured), trajectory, max_speed=self.limits[0],
                            max_acceleration=self.limits[1])
            trajectory = lead.then(trajectory) if lead is not None else trajectory
        start = time.monotonic()
        names = list(trajectory.joints)
        for t, row in zip(trajectory.t, trajectory.positions):
            if stop():
                break
            delay = start + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            msg = JointState(name=names, position=[float(v) for v in row])
            msg.header.stamp = self.node.get_clock().now().to_msg()
            self.publisher.publish(msg)
        return lead.duration_s if lead is not None else 0.0

    def wait_for_box(self, timeout_s: float = 5.0) -> np.ndarray:
        deadline = time.monotonic() + timeout_s
        while self.box_xyz is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.box_xyz is None:
            raise PlayerError("no box pose received: is the workcell (or the box perception) running?")
        return self.box_xyz.copy()


def _call(client, request, timeout_s: float, hint: str):
    """A service call from a thread that does not spin the node (another thread does)."""
    if not client.wait_for_service(timeout_sec=timeout_s):
        raise PlayerError(f"service {client.srv_name} is not available: {hint}")
    future = client.call_async(request)
    deadline = time.monotonic() + timeout_s
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.005)
    if not future.done():
        raise PlayerError(f"{client.srv_name} did not answer within {timeout_s} s")
    response = future.result()
    if response.error.code != ErrorCode.NONE:
        raise PlayerError(f"{client.srv_name}: {response.error.message}")
    return response


class MonitorClient:
    """Arms the envelope monitor for a played excitation and disarms it right after (its
    command watchdog faults when an armed stream stops); reports a fault it latched."""

    def __init__(self, node: Node, monitor: str = "/envelope_monitor") -> None:
        self.arm_client = node.create_client(SetArmed, f"{monitor}/set_armed")
        self.status = EnvelopeStatus()
        node.create_subscription(EnvelopeStatus, "/twinloop/envelope/status",
                                 lambda msg: setattr(self, "status", msg), LATCHED)

    def set_armed(self, armed: bool, timeout_s: float = 5.0) -> None:
        _call(self.arm_client, SetArmed.Request(armed=armed), timeout_s,
              "start the envelope monitor (python -m twinloop_safety.envelope_monitor_node), the only writer "
              "of /joint_command")

    def faulted(self) -> bool:
        return self.status.state == EnvelopeStatus.STATE_FAULT

    def check(self, what: str) -> None:
        if self.faulted():
            raise PlayerError(f"the envelope monitor stopped {what}: fault {self.status.fault}, "
                              f"{self.status.reason}; the robot holds. Lower the excitation (amplitudes, band) "
                              "or widen config/envelope.yaml, then reset the fault (~/reset_fault)")


class RecorderClient:
    """Starts and stops a session of the twinloop recorder (`/recorder/start`, `/recorder/stop`)."""

    def __init__(self, node: Node, recorder: str = "/recorder") -> None:
        self.node = node
        self.start_client = node.create_client(StartRecording, f"{recorder}/start")
        self.stop_client = node.create_client(StopRecording, f"{recorder}/stop")
        self.status = RecordingStatus()
        node.create_subscription(RecordingStatus, f"{recorder}/status", lambda msg: setattr(self, "status", msg),
                                 LATCHED)

    def _call(self, client, request, timeout_s: float):
        return _call(client, request, timeout_s, "start the recorder (python -m twinloop_logging.recorder_node)")

    def start(self, *, split: str, output_dir: str = "", note: str = "", twin_version: str = "",
              timeout_s: float = 10.0, required_topics=REQUIRED_TOPICS) -> str:
        """Start a session and return once the recorder records `required_topics` and the
        simulator's applied-command and box-pose topics this node sees (the recorder
        subscribes as it discovers their publishers); else stop it and raise."""
        request = StartRecording.Request(profile="identification", output_dir=output_dir, operator_note=note,
                                         twin_version=twin_version)
        request.session = SessionId(purpose=SessionId.PURPOSE_IDENTIFICATION, split=split)
        seen = [t for t, _ in self.node.get_topic_names_and_types() if t.startswith("/twinloop/")
                and t.endswith((APPLIED_COMMAND_SUFFIX, BOX_POSE_SUFFIX))]
        required_topics = [*required_topics, *seen]
        bag_path = self._call(self.start_client, request, timeout_s).bag_path
        deadline = time.monotonic() + timeout_s
        while missing := not_yet_recorded(self.status, bag_path, required_topics):
            if time.monotonic() > deadline:
                self.stop()
                raise PlayerError(f"the recorder found no publisher of {missing} within {timeout_s:.0f} s: start "
                                  f"the robot driver and the envelope monitor on this ROS_DOMAIN_ID (bag kept: "
                                  f"{bag_path})")
            time.sleep(0.02)
        return bag_path

    def stop(self, timeout_s: float = 20.0) -> str:
        return self._call(self.stop_client, StopRecording.Request(), timeout_s).bag_path
