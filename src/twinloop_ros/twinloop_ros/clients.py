"""The suite's own services and actions as plain calls, in the spirit of nav2_simple_commander.

Each client attaches to a node that another thread spins (a `RosSession`, or a node on a
multi-threaded executor whose callback group lets service responses through while the
caller waits) and blocks the calling thread only:

    session = RosSession(name="my_tool")
    monitor = EnvelopeClient(session.node)
    monitor.arm()                 # raises ClientError with the monitor's reason if refused
    ...
    monitor.disarm()

Every failure is a `ClientError` whose message says what was wrong and what to do.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from rclpy.action import ActionClient
from rclpy.node import Node
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode, RecordingStatus, SessionId
from twinloop_interfaces.srv import ResetFault, SetArmed, StartRecording, StopRecording

from twinloop_ros.qos import LATCHED

MONITOR_HINT = ("start the envelope monitor (`twinloop bringup`, or `envelope_monitor` with "
                "config/envelope.yaml) on this ROS_DOMAIN_ID; it is the only writer of /joint_command")
RECORDER_HINT = "start the recorder (`twinloop bringup`, or `recorder` with config/recorder.yaml) on this ROS_DOMAIN_ID"


class ClientError(RuntimeError):
    """A call to a twinloop node failed; the message says what was wrong and what to do."""


def wait_future(future, timeout_s: float, what: str):
    """Wait for a future that another thread completes; raise ClientError on timeout."""
    deadline = time.monotonic() + timeout_s
    while not future.done():
        if time.monotonic() > deadline:
            raise ClientError(f"{what}: no answer within {timeout_s:.0f} s")
        time.sleep(0.002)
    return future.result()


def call_service(client, request, timeout_s: float, hint: str):
    """Call a service from a thread that does not spin the node; errors carry the node's
    `error` field (twinloop_interfaces/ErrorCode) where the response has one."""
    if not client.wait_for_service(timeout_sec=timeout_s):
        raise ClientError(f"service {client.srv_name} is not available: {hint}")
    response = wait_future(client.call_async(request), timeout_s, f"service {client.srv_name}")
    error = getattr(response, "error", None)
    if error is not None and error.code != ErrorCode.NONE:
        raise ClientError(f"{client.srv_name}: {error.message}")
    return response


def not_yet_recorded(status: RecordingStatus, bag_path: str, required: Sequence[str]) -> list[str]:
    """Topics of `required` that a recorder's status does not list as recorded into
    `bag_path` yet. The recorder subscribes to a topic once it has discovered a publisher
    of it, which can take a moment after a session starts; a client that needs a topic in
    the bag from its first message waits for this to be empty."""
    recorded = {t.topic for t in status.topics} if status.recording and status.bag_path == bag_path else set()
    return sorted(set(required) - recorded)


class EnvelopeClient:
    """Arm, disarm and reset the envelope monitor; its latched status and fault."""

    def __init__(self, node: Node, *, monitor: str = "/envelope_monitor",
                 status_topic: str = "/twinloop/envelope/status", callback_group=None) -> None:
        self.node = node
        self.status: EnvelopeStatus | None = None
        self._arm = node.create_client(SetArmed, f"{monitor}/set_armed", callback_group=callback_group)
        self._reset = node.create_client(ResetFault, f"{monitor}/reset_fault", callback_group=callback_group)
        node.create_subscription(EnvelopeStatus, status_topic, self._on_status, LATCHED,
                                 callback_group=callback_group)

    def _on_status(self, msg: EnvelopeStatus) -> None:
        self.status = msg

    def wait_for_status(self, timeout_s: float = 10.0) -> EnvelopeStatus:
        deadline = time.monotonic() + timeout_s
        while self.status is None:
            if time.monotonic() > deadline:
                raise ClientError(f"no envelope monitor status within {timeout_s:.0f} s: {MONITOR_HINT}")
            time.sleep(0.01)
        return self.status

    def set_armed(self, armed: bool, timeout_s: float = 5.0) -> SetArmed.Response:
        return call_service(self._arm, SetArmed.Request(armed=armed), timeout_s, MONITOR_HINT)

    def arm(self, timeout_s: float = 5.0) -> None:
        self.set_armed(True, timeout_s)

    def disarm(self, timeout_s: float = 5.0) -> None:
        self.set_armed(False, timeout_s)

    def reset_fault(self, timeout_s: float = 5.0) -> ResetFault.Response:
        return call_service(self._reset, ResetFault.Request(), timeout_s, MONITOR_HINT)

    def faulted(self) -> bool:
        return self.status is not None and self.status.state == EnvelopeStatus.STATE_FAULT

    def fault_text(self) -> str:
        """'fault N, reason' of the latched fault; '' when none."""
        if not self.faulted():
            return ""
        return f"fault {self.status.fault}, {self.status.reason}"


class RecorderClient:
    """Start, stop and annotate sessions of the twinloop recorder; its latched status."""

    def __init__(self, node: Node, *, recorder: str = "/recorder", callback_group=None) -> None:
        self.node = node
        self.status = RecordingStatus()
        self._start = node.create_client(StartRecording, f"{recorder}/start", callback_group=callback_group)
        self._stop = node.create_client(StopRecording, f"{recorder}/stop", callback_group=callback_group)
        self._recorder = recorder
        node.create_subscription(RecordingStatus, f"{recorder}/status", self._on_status, LATCHED,
                                 callback_group=callback_group)

    def _on_status(self, msg: RecordingStatus) -> None:
        self.status = msg

    def start(self, *, profile: str, purpose: int, split: str, output_dir: str = "", note: str = "",
              twin_version: str = "", policy_version: str = "", timeout_s: float = 10.0) -> str:
        """Start a session; returns the bag path."""
        request = StartRecording.Request(profile=profile, output_dir=output_dir, operator_note=note,
                                         twin_version=twin_version, policy_version=policy_version)
        request.session = SessionId(purpose=purpose, split=split)
        return call_service(self._start, request, timeout_s, RECORDER_HINT).bag_path

    def wait_until_recording(self, bag_path: str, topics: Sequence[str], timeout_s: float = 5.0) -> None:
        """Return once the recorder records every topic of `topics` into `bag_path`."""
        deadline = time.monotonic() + timeout_s
        while missing := not_yet_recorded(self.status, bag_path, topics):
            if time.monotonic() > deadline:
                raise ClientError(f"the recorder found no publisher of {', '.join(missing)} within "
                                  f"{timeout_s:.0f} s: start the robot driver (or the emulated workcell) and the "
                                  f"envelope monitor on this ROS_DOMAIN_ID (bag kept: {bag_path})")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 20.0) -> str:
        """Stop the session; returns the bag path."""
        return call_service(self._stop, StopRecording.Request(), timeout_s, RECORDER_HINT).bag_path


class GoalClient:
    """One action of a twinloop node as a blocking call with feedback and cancel on Ctrl-C.

    `send(goal, on_feedback)` returns the result message; the action's `error` field
    (ErrorCode) becomes a ClientError, as does a rejected or aborted goal.
    """

    def __init__(self, node: Node, action_type, action_name: str, *, hint: str, callback_group=None) -> None:
        self.node = node
        self.name = action_name
        self.hint = hint
        self._client = ActionClient(node, action_type, action_name, callback_group=callback_group)

    def send(self, goal, on_feedback: Callable[[Any], None] | None = None, *, timeout_s: float = 3600.0,
             server_timeout_s: float = 10.0):
        if not self._client.wait_for_server(timeout_sec=server_timeout_s):
            raise ClientError(f"action {self.name} is not available: {self.hint}")
        feedback = (lambda msg: on_feedback(msg.feedback)) if on_feedback else None
        handle = wait_future(self._client.send_goal_async(goal, feedback_callback=feedback), server_timeout_s,
                             f"action {self.name}")
        if not handle.accepted:
            raise ClientError(f"action {self.name} rejected the goal: {self.hint}")
        result_future = handle.get_result_async()
        try:
            response = wait_future(result_future, timeout_s, f"action {self.name}")
        except KeyboardInterrupt:
            wait_future(handle.cancel_goal_async(), 10.0, f"cancelling {self.name}")
            raise
        result = response.result
        error = getattr(result, "error", None)
        if error is not None and error.code != ErrorCode.NONE:
            raise ClientError(f"{self.name}: {error.message}")
        return result
