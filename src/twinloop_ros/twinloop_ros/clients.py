"""The suite's own services and actions as plain calls, in the spirit of nav2_simple_commander.

Each client attaches to a node that another thread spins (a `RosSession`, or a node on a
multi-threaded executor whose callback group lets service responses through while the
caller waits) and blocks the calling thread only:

    session = RosSession(name="my_tool")
    monitor = EnvelopeClient(session.node)
    monitor.arm()                 # raises ClientError with the monitor's reason if refused
    ...
    monitor.disarm()
    trials = TrialsClient(session.node)
    result = trials.run("policies/reach", 10, on_feedback=print)   # Ctrl-C cancels the goal

Every failure is a `ClientError` whose message says what was wrong and what to do and whose
`code` is a twinloop_interfaces/ErrorCode constant: the node's own code where it answered
with one, NOT_READY where no node answered, TIMEOUT where it answered too late. A goal
that ends cancelled (Ctrl-C here, or a cancel from elsewhere) raises `GoalCanceled`.
"""
from __future__ import annotations

import math
import threading
import time
import uuid
from typing import Any, Callable, Sequence

from action_msgs.msg import GoalStatus, GoalStatusArray
from rclpy.action import ActionClient
from rclpy.action.client import ClientGoalHandle
from rclpy.node import Node
from twinloop_interfaces.action import BuildTwin, Calibrate, Replay, RunTrials
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode, RecordingStatus, SessionId
from twinloop_interfaces.srv import AnnotateRecording, ResetFault, SetArmed, StartRecording, StopRecording

from twinloop_ros.qos import LATCHED
from unique_identifier_msgs.msg import UUID

MONITOR_HINT = ("start the envelope monitor (`twinloop bringup`, or `envelope_monitor` with "
                "config/envelope.yaml) on this ROS_DOMAIN_ID; it is the only writer of /joint_command")
RECORDER_HINT = "start the recorder (`twinloop bringup`, or `recorder` with config/recorder.yaml) on this ROS_DOMAIN_ID"
CALIBRATION_HINT = ("start the calibration server (`twinloop bringup`, or `calibration_server` with "
                    "config/calibration.yaml) on this ROS_DOMAIN_ID")
RUNNER_HINT = ("start the policy runner (`twinloop bringup`, or `policy_runner` with config/policy_runner.yaml) "
               "on this ROS_DOMAIN_ID")
BUILDER_HINT = ("start the twin builder (`twinloop bringup`, or `twin_builder` with config/builder.yaml) "
                "on this ROS_DOMAIN_ID")
REPLAY_HINT = "start the replay server (`twinloop bringup`, or `replay_server`) on this ROS_DOMAIN_ID"

# A goal whose server has been gone this long is given up on (its node exited or hung).
SERVER_GONE_S = 3.0
# How long an answer may lag the server's own word that the goal was taken or ended.
LOST_ANSWER_GRACE_S = 2.0
ENDED = (GoalStatus.STATUS_SUCCEEDED, GoalStatus.STATUS_ABORTED, GoalStatus.STATUS_CANCELED)

STATE_NAMES = {EnvelopeStatus.STATE_DISARMED: "disarmed", EnvelopeStatus.STATE_ARMED: "armed",
               EnvelopeStatus.STATE_FAULT: "fault"}
FAULT_NAMES = {getattr(EnvelopeStatus, n): n[len("FAULT_"):].lower() for n in dir(EnvelopeStatus)
               if n.startswith("FAULT_")}


class ClientError(RuntimeError):
    """A call to a twinloop node failed; the message says what was wrong and what to do.

    `code`: the twinloop_interfaces/ErrorCode constant (the node's own where it gave one)."""

    def __init__(self, message: str, code: int = ErrorCode.UNKNOWN) -> None:
        super().__init__(message)
        self.code = code


class GoalCanceled(ClientError):
    """The goal ended cancelled; `result` is what the server answered (None if it did not)."""

    def __init__(self, message: str, result: Any = None) -> None:
        super().__init__(message, ErrorCode.CANCELED)
        self.result = result


def wait_future(future, timeout_s: float, what: str, alive: Callable[[], bool] | None = None,
                renew: Callable[[float], Any] | None = None):
    """Wait for a future that another thread completes; ClientError (TIMEOUT) after
    `timeout_s` (math.inf: no limit), ClientError (NOT_READY) once `alive()` has been false
    for SERVER_GONE_S. `renew(now)`, called every half second, may return a future to wait
    on instead (a request asked again)."""
    deadline = time.monotonic() + timeout_s
    gone_since = None
    next_check = time.monotonic() + 0.5
    while not future.done():
        now = time.monotonic()
        if now > deadline:
            raise ClientError(f"{what}: no answer within {timeout_s:.0f} s", ErrorCode.TIMEOUT)
        if now >= next_check:
            next_check = now + 0.5
            if alive is not None:
                gone_since = None if alive() else (gone_since or now)
                if gone_since is not None and now - gone_since > SERVER_GONE_S:
                    raise ClientError(f"{what}: the server went away while it ran (its node exited?); see its log",
                                      ErrorCode.NOT_READY)
            if renew is not None:
                future = renew(now) or future
        time.sleep(0.002)
    return future.result()


def call_service(client, request, timeout_s: float, hint: str):
    """Call a service from a thread that does not spin the node; errors carry the node's
    `error` field (twinloop_interfaces/ErrorCode) where the response has one."""
    if not client.wait_for_service(timeout_sec=timeout_s):
        raise ClientError(f"service {client.srv_name} is not available: {hint}", ErrorCode.NOT_READY)
    response = wait_future(client.call_async(request), timeout_s, f"service {client.srv_name}")
    error = getattr(response, "error", None)
    if error is not None and error.code != ErrorCode.NONE:
        raise ClientError(f"{client.srv_name}: {error.message}", error.code)
    return response


def not_yet_recorded(status: RecordingStatus, bag_path: str, required: Sequence[str]) -> list[str]:
    """Topics of `required` that a recorder's status does not list as recorded into
    `bag_path` yet. The recorder subscribes to a topic once it has discovered a publisher
    of it, which can take a moment after a session starts; a client that needs a topic in
    the bag from its first message waits for this to be empty."""
    recorded = {t.topic for t in status.topics} if status.recording and status.bag_path == bag_path else set()
    return sorted(set(required) - recorded)


def describe_envelope(status: EnvelopeStatus) -> str:
    """'armed, 1200 commands forwarded, 0 rejected' / 'fault velocity_limit: <reason>, ...'."""
    state = STATE_NAMES.get(status.state, f"state {status.state}")
    if status.state == EnvelopeStatus.STATE_FAULT:
        state += f" {FAULT_NAMES.get(status.fault, status.fault)}: {status.reason}"
    return f"{state}; {status.commands_forwarded} commands forwarded, {status.commands_rejected} rejected"


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
                raise ClientError(f"no envelope monitor status within {timeout_s:.0f} s: {MONITOR_HINT}",
                                  ErrorCode.NOT_READY)
            time.sleep(0.01)
        return self.status

    def wait_for_state(self, state: int, timeout_s: float = 5.0) -> EnvelopeStatus:
        """Return the latched status once it reports `state` (EnvelopeStatus.STATE_*)."""
        deadline = time.monotonic() + timeout_s
        while self.status is None or self.status.state != state:
            if time.monotonic() > deadline:
                now = describe_envelope(self.status) if self.status else "no status"
                raise ClientError(f"the envelope monitor did not report {STATE_NAMES.get(state, state)} within "
                                  f"{timeout_s:.0f} s ({now})", ErrorCode.TIMEOUT)
            time.sleep(0.01)
        return self.status

    def set_armed(self, armed: bool, timeout_s: float = 5.0) -> SetArmed.Response:
        return call_service(self._arm, SetArmed.Request(armed=armed), timeout_s, MONITOR_HINT)

    def arm(self, timeout_s: float = 5.0) -> None:
        self.set_armed(True, timeout_s)

    def disarm(self, timeout_s: float = 5.0) -> None:
        self.set_armed(False, timeout_s)

    def disarm_nowait(self) -> None:
        """Ask the monitor to disarm without waiting for the answer (a node shutting down,
        whose executor no longer spins)."""
        if self._arm.service_is_ready():
            self._arm.call_async(SetArmed.Request(armed=False))

    def reset_fault(self, timeout_s: float = 5.0, note: str = "") -> ResetFault.Response:
        """Clear a latched fault (`cleared_fault` says which; FAULT_NONE when none was latched)."""
        return call_service(self._reset, ResetFault.Request(operator_note=note), timeout_s, MONITOR_HINT)

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
        self.status_received = False  # the recorder publishes its status from its first session on
        self._start = node.create_client(StartRecording, f"{recorder}/start", callback_group=callback_group)
        self._stop = node.create_client(StopRecording, f"{recorder}/stop", callback_group=callback_group)
        self._annotate = node.create_client(AnnotateRecording, f"{recorder}/annotate", callback_group=callback_group)
        self._recorder = recorder
        node.create_subscription(RecordingStatus, f"{recorder}/status", self._on_status, LATCHED,
                                 callback_group=callback_group)

    def _on_status(self, msg: RecordingStatus) -> None:
        self.status = msg
        self.status_received = True

    def wait_for_recorder(self, timeout_s: float = 5.0, status_grace_s: float = 1.0) -> RecordingStatus | None:
        """Return the recorder's latched status once the recorder is up; None when it has
        not recorded since it started (it publishes no status before its first session)."""
        if not self._start.wait_for_service(timeout_sec=timeout_s):
            raise ClientError(f"no recorder at {self._recorder}: {RECORDER_HINT}", ErrorCode.NOT_READY)
        deadline = time.monotonic() + status_grace_s
        while not self.status_received and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.status if self.status_received else None

    def start(self, *, profile: str, purpose: str, split: str, output_dir: str = "", note: str = "",
              twin_version: str = "", policy_version: str = "", session_id: str = "", trial_index: int = 0,
              timeout_s: float = 10.0) -> str:
        """Start a session; returns the bag path."""
        request = StartRecording.Request(profile=profile, output_dir=output_dir, operator_note=note,
                                         twin_version=twin_version, policy_version=policy_version)
        request.session = SessionId(purpose=purpose, split=split, session_id=session_id, trial_index=trial_index)
        return call_service(self._start, request, timeout_s, RECORDER_HINT).bag_path

    def wait_until_recording(self, bag_path: str, topics: Sequence[str], timeout_s: float = 5.0) -> None:
        """Return once the recorder records every topic of `topics` into `bag_path`."""
        deadline = time.monotonic() + timeout_s
        while missing := not_yet_recorded(self.status, bag_path, topics):
            if time.monotonic() > deadline:
                raise ClientError(f"the recorder found no publisher of {', '.join(missing)} within "
                                  f"{timeout_s:.0f} s: start the robot driver (or the emulated workcell) and the "
                                  f"envelope monitor on this ROS_DOMAIN_ID (bag kept: {bag_path})", ErrorCode.NOT_READY)
            time.sleep(0.02)

    def annotate(self, note: str, timeout_s: float = 5.0) -> None:
        """Add a timestamped operator note to the session being recorded."""
        call_service(self._annotate, AnnotateRecording.Request(note=note), timeout_s, RECORDER_HINT)

    def stop(self, timeout_s: float = 20.0) -> str:
        """Stop the session; returns the bag path. `status` then holds the final per-topic counts."""
        response = call_service(self._stop, StopRecording.Request(), timeout_s, RECORDER_HINT)
        self.status = response.status
        return response.bag_path


class GoalClient:
    """One action of a twinloop node as a blocking call with feedback and cancel on Ctrl-C.

    `send(goal, on_feedback)` returns the result message; the action's `error` field
    (ErrorCode) becomes a ClientError with that code, as does a rejected or aborted goal.
    A KeyboardInterrupt while the goal runs cancels it (calling `on_cancel()` first), waits
    up to `cancel_wait_s` for the server to end it (a second KeyboardInterrupt stops the
    wait), and raises GoalCanceled. The typed clients below pass these options through.
    """

    def __init__(self, node: Node, action_type, action_name: str, *, hint: str, callback_group=None) -> None:
        self.node = node
        self.name = action_name
        self.hint = hint
        self._action_type = action_type
        self._client = ActionClient(node, action_type, action_name, callback_group=callback_group)
        # What the server says about its goals, watched on its own: the answer to a goal
        # request can be lost while the server's answer writer has not yet matched this client
        # (DDS discovery on a fresh process), though the goal was accepted and runs.
        self._lock = threading.Lock()
        self._heard: dict[bytes, int] = {}
        self._status_sub = node.create_subscription(GoalStatusArray, f"{action_name}/_action/status",
                                                    self._on_status, LATCHED, callback_group=callback_group)

    def _on_status(self, msg: GoalStatusArray) -> None:
        with self._lock:
            for status in msg.status_list:
                key = bytes(status.goal_info.goal_id.uuid)
                if key in self._heard:
                    self._heard[key] = status.status

    def _heard_of(self, key: bytes) -> int | None:
        """The goal's last status the server published; STATUS_UNKNOWN once only feedback came;
        None while the server has said nothing about it."""
        with self._lock:
            status = self._heard.get(key)
        return None if status is None or status < 0 else status

    def send(self, goal, on_feedback: Callable[[Any], None] | None = None, *, timeout_s: float = math.inf,
             server_timeout_s: float = 10.0, cancel_wait_s: float = 30.0,
             on_cancel: Callable[[], None] | None = None):
        if not self._client.wait_for_server(timeout_sec=server_timeout_s):
            raise ClientError(f"action {self.name} is not available: {self.hint}", ErrorCode.NOT_READY)
        goal_id = UUID(uuid=list(uuid.uuid4().bytes))
        key = bytes(goal_id.uuid)
        with self._lock:
            self._heard[key] = -1

        def feedback(msg) -> None:
            with self._lock:
                if self._heard.get(key, 0) < 0:
                    self._heard[key] = GoalStatus.STATUS_UNKNOWN
            if on_feedback is not None:
                on_feedback(msg.feedback)

        try:
            sent = self._client.send_goal_async(goal, feedback_callback=feedback, goal_uuid=goal_id)
            try:
                handle = self._accepted(sent, goal_id, server_timeout_s)
            except KeyboardInterrupt:
                # Interrupted before the answer: a goal accepted meanwhile must not run on.
                handle = self._accepted(sent, goal_id, 5.0)
                if handle.accepted:
                    self._cancel(handle, cancel_wait_s, on_cancel)
                raise GoalCanceled(f"{self.name}: canceled before it started") from None
            if not handle.accepted:
                raise ClientError(f"action {self.name} rejected the goal (is it busy with another one?): "
                                  f"{self.hint}", ErrorCode.NOT_READY)
            return self._finish(handle, key, timeout_s, cancel_wait_s, on_cancel)
        finally:
            with self._lock:
                self._heard.pop(key, None)

    def _accepted(self, sent, goal_id: UUID, timeout_s: float) -> ClientGoalHandle:
        """The goal's handle once the server answered the request, or once it published
        feedback or a status for the goal (then the answer was lost on the way: the goal runs)."""
        key = bytes(goal_id.uuid)
        deadline = time.monotonic() + timeout_s
        heard_at = None
        while not sent.done():
            now = time.monotonic()
            if self._heard_of(key) is not None:
                heard_at = heard_at or now
                if now - heard_at > LOST_ANSWER_GRACE_S:
                    self.node.get_logger().warning(f"{self.name}: the server's answer to the goal request was lost; "
                                                   "it runs the goal (its status and feedback say so)")
                    response = self._action_type.Impl.SendGoalService.Response(accepted=True)
                    return ClientGoalHandle(self._client, goal_id, response)
            elif now > deadline:
                raise ClientError(f"action {self.name}: no answer within {timeout_s:.0f} s", ErrorCode.TIMEOUT)
            time.sleep(0.002)
        return sent.result()

    def _result(self, handle: ClientGoalHandle, key: bytes, timeout_s: float):
        """The goal's result; asked again when the server has published the goal's end and
        its answer to the request did not come (lost the way a goal answer can be)."""
        ended_at = None

        def ask_again(now: float):
            nonlocal ended_at
            if self._heard_of(key) not in ENDED:
                return None
            ended_at = ended_at or now
            if now - ended_at <= LOST_ANSWER_GRACE_S:
                return None
            ended_at = None
            self.node.get_logger().warning(f"{self.name}: the goal ended but its result did not come; asking again")
            return handle.get_result_async()

        return wait_future(handle.get_result_async(), timeout_s, f"action {self.name}",
                           alive=self._client.server_is_ready, renew=ask_again)

    def _finish(self, handle: ClientGoalHandle, key: bytes, timeout_s: float, cancel_wait_s: float,
                on_cancel: Callable[[], None] | None):
        try:
            response = self._result(handle, key, timeout_s)
        except KeyboardInterrupt:
            response = self._cancel(handle, cancel_wait_s, on_cancel)
            result = response.result if response is not None else None
            said = getattr(getattr(result, "error", None), "message", "") or "no answer from the server"
            raise GoalCanceled(f"{self.name}: canceled ({said})", result) from None
        except ClientError as error:
            if error.code == ErrorCode.TIMEOUT:
                self._cancel(handle, cancel_wait_s)
            raise
        result = response.result
        error = getattr(result, "error", None)
        if response.status == GoalStatus.STATUS_CANCELED or (error is not None and error.code == ErrorCode.CANCELED):
            raise GoalCanceled(f"{self.name}: canceled ({getattr(error, 'message', '')})", result)
        if error is not None and error.code != ErrorCode.NONE:
            raise ClientError(f"{self.name}: {error.message}", error.code)
        if response.status != GoalStatus.STATUS_SUCCEEDED:
            raise ClientError(f"{self.name}: the goal ended with status {response.status} and no error message; "
                              "see the server's log")
        return result

    def _cancel(self, handle, wait_s: float, on_cancel: Callable[[], None] | None = None):
        """Cancel a running goal; the server's final answer, or None if none came within `wait_s`."""
        if on_cancel is not None:
            on_cancel()
        try:
            wait_future(handle.cancel_goal_async(), 10.0, f"cancelling {self.name}")
            return wait_future(handle.get_result_async(), wait_s, f"action {self.name}",
                               alive=self._client.server_is_ready)
        except ClientError:
            return None


class CalibrationClient(GoalClient):
    """The calibration server's ~/calibrate (Calibrate): live or from a bag.

    `setup`: Calibrate.Goal.SETUP_EYE_IN_HAND (camera on the gripper) or SETUP_EYE_TO_HAND."""

    def __init__(self, node: Node, *, server: str = "/calibration_server", callback_group=None) -> None:
        super().__init__(node, Calibrate, f"{server}/calibrate", hint=CALIBRATION_HINT, callback_group=callback_group)

    def live(self, camera: str, setup: str, *, num_views: int = 0,
             on_feedback: Callable[[Calibrate.Feedback], None] | None = None, **options) -> Calibrate.Result:
        """Drive the robot through planned views (through the envelope monitor) and solve."""
        goal = Calibrate.Goal(source=Calibrate.Goal.SOURCE_LIVE, camera=camera, setup=setup, num_views=num_views)
        return self.send(goal, on_feedback, **options)

    def from_bag(self, bag_path: str, camera: str, setup: str, *,
                 on_feedback: Callable[[Calibrate.Feedback], None] | None = None, **options) -> Calibrate.Result:
        goal = Calibrate.Goal(source=Calibrate.Goal.SOURCE_BAG, bag_path=bag_path, camera=camera, setup=setup)
        return self.send(goal, on_feedback, **options)


class TrialsClient(GoalClient):
    """The policy runner's ~/run_trials (RunTrials)."""

    def __init__(self, node: Node, *, runner: str = "/policy_runner", callback_group=None) -> None:
        super().__init__(node, RunTrials, f"{runner}/run_trials", hint=RUNNER_HINT, callback_group=callback_group)

    def run(self, policy_path: str, num_trials: int, *, split: str = SessionId.SPLIT_HELD_OUT, record: bool = True,
            trial_timeout_s: float = 0.0, on_feedback: Callable[[RunTrials.Feedback], None] | None = None,
            **options) -> RunTrials.Result:
        """Run `num_trials` trials of the policy folder; the result lists each trial's outcome."""
        goal = RunTrials.Goal(policy_path=policy_path, num_trials=num_trials, split=split, record=record,
                              trial_timeout_s=trial_timeout_s)
        return self.send(goal, on_feedback, **options)


class BuildClient(GoalClient):
    """The twin builder's ~/build (BuildTwin)."""

    def __init__(self, node: Node, *, builder: str = "/twin_builder", callback_group=None) -> None:
        super().__init__(node, BuildTwin, f"{builder}/build", hint=BUILDER_HINT, callback_group=callback_group)

    def build(self, fit_bags: Sequence[str], held_out_bags: Sequence[str] = (), *, workcell: str = "",
              parent_version: int = -1, parameters: Sequence[str] = (),
              on_feedback: Callable[[BuildTwin.Feedback], None] | None = None, **options) -> BuildTwin.Result:
        """Identify from the fit bags (held-out ones only score) and write the next twin version."""
        goal = BuildTwin.Goal(workcell=workcell, parent_version=parent_version, fit_bags=list(fit_bags),
                              held_out_bags=list(held_out_bags), parameters=list(parameters))
        return self.send(goal, on_feedback, **options)

    def build_geometry(self, scan_bag: str, *, calibration: str = "", workcell: str = "", parent_version: int = -1,
                       on_feedback: Callable[[BuildTwin.Feedback], None] | None = None, **options) -> BuildTwin.Result:
        """Fuse a scan bag and write the next twin version with its geometry."""
        goal = BuildTwin.Goal(workcell=workcell, parent_version=parent_version, scan_bag=scan_bag,
                              scan_calibration=calibration)
        return self.send(goal, on_feedback, **options)


class ReplayClient(GoalClient):
    """The replay server's ~/replay (Replay)."""

    def __init__(self, node: Node, *, server: str = "/replay_server", callback_group=None) -> None:
        super().__init__(node, Replay, f"{server}/replay", hint=REPLAY_HINT, callback_group=callback_group)

    def replay(self, bag_path: str, *, twin_path: str = "", output_dir: str = "", real_time: bool = False,
               on_feedback: Callable[[Replay.Feedback], None] | None = None, **options) -> Replay.Result:
        """Replay a recorded run in a twin (empty twin_path: the latest version)."""
        goal = Replay.Goal(bag_path=bag_path, twin_path=twin_path, output_dir=output_dir, real_time=real_time)
        return self.send(goal, on_feedback, **options)
