"""Policy runner: runs an exported policy at its rate, through the envelope monitor.

Loads a policy folder and refuses to start on a mismatch with the robot; assembles
observations from /joint_states with staleness checks; publishes position targets to
/twinloop/policy/command (never to the hardware topic); serves ~/run_trials, which resets
the scene between trials (the simulator's reset service, or the operator on hardware),
arms the monitor for each trial and records each through the recorder.
The algorithms are in policy_spec.py and runner.py.
"""
from __future__ import annotations

import time

from rclpy.action import ActionServer, CancelResponse
from rclpy.node import Node
from twinloop_ros.clients import not_yet_recorded
from twinloop_ros.qos import LATCHED, RELIABLE
from rclpy.task import Future
from sensor_msgs.msg import JointState
from twinloop_interfaces.action import RunTrials
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode, RecordingStatus, SessionId, TrialOutcome
from twinloop_interfaces.srv import ConfirmReset, ResetFault, ResetWorkcell, SetArmed, StartRecording, StopRecording

from twinloop_policy.policy_spec import PolicyMismatch, PolicySpecError, check_against_robot, load_policy_spec
from twinloop_policy.runner import ObservationAssembler, PolicyLoop, StaleObservation, goal_reached, load_module
from twinloop_ros.node import StartupError, declare, make_executor, run_node
from twinloop_twin.physics import ALL_JOINTS, COMMANDED_JOINTS

SERVICE_WAIT_S = 5.0
STALE_ABORT_PERIODS = 25  # consecutive periods without a fresh observation that end a trial


class TrialFailed(RuntimeError):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class PolicyRunnerNode(Node):
    def __init__(self) -> None:
        super().__init__("policy_runner")
        self.p = declare(self, {
            "policy_path": ("", "policy folder loaded (and checked) at startup; empty: only ~/run_trials goals"),
            "autostart": (False, "run policy_path continuously from startup (arming the monitor)"),
            "joint_state_rate_hz": (500.0, "Hz, rate of the robot's /joint_states (policies may not be faster)"),
            "command_topic": ("/twinloop/policy/command", "where targets go: the envelope monitor's input"),
            "joint_states_topic": ("/joint_states", "measured joint states"),
            "monitor_node": ("/envelope_monitor", "the envelope monitor whose services arm it per trial"),
            "arm_monitor": (True, "arm the monitor for each trial and disarm after"),
            "simulated": (True, "true: reset the scene with reset_service; false: ask the operator"),
            "reset_service": ("/emulated_workcell/reset", "ResetWorkcell service of the simulator"),
            "operator_service": ("/twinloop/operator/confirm_reset", "ConfirmReset service of the operator"),
            "settle_s": (0.5, "s, wait after a scene reset before the trial starts"),
            "recorder_node": ("/recorder", "recorder whose start/stop services record the trials"),
            "record_profile": ("trial", "recording profile of each trial"),
            "record_required_topics": (["/joint_states", "/joint_command"],
                                       "topics the recorder must be recording before a trial starts"),
            "record_ready_timeout_s": (5.0, "s, wait for the recorder to find required topics' publishers"),
            "bag_dir": ("", "parent folder of the trial bags; empty: the recorder's default"),
            "twin_version": ("", "twin in use, recorded with each trial (e.g. emulated/v0)"),
        })
        self.loop: PolicyLoop | None = None
        self.assembler: ObservationAssembler | None = None
        self.envelope = EnvelopeStatus()
        self._timer = None
        self._trial: dict | None = None
        self.stale_skips = 0
        self.command_pub = self.create_publisher(JointState, self.p["command_topic"], RELIABLE)
        self.create_subscription(JointState, self.p["joint_states_topic"], self.on_joint_state, RELIABLE)
        self.create_subscription(EnvelopeStatus, "/twinloop/envelope/status", self.on_envelope, LATCHED)
        self.recorder_status = RecordingStatus()
        self.create_subscription(RecordingStatus, f"{self.p['recorder_node']}/status",
                                 lambda msg: setattr(self, "recorder_status", msg), LATCHED)
        monitor, recorder = self.p["monitor_node"], self.p["recorder_node"]
        self.arm_client = self.create_client(SetArmed, f"{monitor}/set_armed")
        self.fault_client = self.create_client(ResetFault, f"{monitor}/reset_fault")
        self.reset_client = self.create_client(ResetWorkcell, self.p["reset_service"])
        self.operator_client = self.create_client(ConfirmReset, self.p["operator_service"])
        self.start_client = self.create_client(StartRecording, f"{recorder}/start")
        self.stop_client = self.create_client(StopRecording, f"{recorder}/stop")
        # Execute is a coroutine: it awaits service calls and trials without blocking the
        # executor, so the inference timer keeps its rate on the single-threaded executor.
        self.action_server = ActionServer(self, RunTrials, "~/run_trials", execute_callback=self.execute,
                                          cancel_callback=lambda _: CancelResponse.ACCEPT)
        if self.p["policy_path"]:
            try:
                self.activate(self.p["policy_path"])
            except (PolicySpecError, PolicyMismatch) as error:
                raise StartupError(str(error)) from error
            if self.p["autostart"]:
                self.create_timer(0.2, self._autostart_once)
        self.get_logger().info("policy runner up" + (f": {self.loop.spec.policy_version} at "
                                                     f"{self.loop.spec.rate_hz:.0f} Hz" if self.loop else ""))

    # ---------------------------------------------------------------- lifecycle (configure/activate)
    def activate(self, policy_path: str) -> None:
        """Load and check a policy (configure) and make it the active one."""
        spec = load_policy_spec(policy_path)
        check_against_robot(spec, commandable=COMMANDED_JOINTS, measured=ALL_JOINTS,
                            joint_state_rate_hz=self.p["joint_state_rate_hz"])
        self.loop = PolicyLoop(spec, load_module(spec))
        self.assembler = ObservationAssembler(spec)

    def _start_stepping(self, done: Future, timeout_s: float, *, judge: bool = True) -> None:
        """Step the policy at its rate until `done`: goal (when judged), timeout (> 0), fault."""
        self.loop.reset()
        self._trial = {"done": done, "start": time.monotonic(), "timeout_s": timeout_s, "judge": judge}
        self._timer = self.create_timer(1.0 / self.loop.spec.rate_hz, self.on_tick)

    def deactivate(self) -> None:
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None
        self._trial = None

    # ---------------------------------------------------------------- callbacks
    def on_joint_state(self, msg: JointState) -> None:
        if self.assembler is not None:
            self.assembler.on_joint_state(msg.name, msg.position, msg.velocity, time.monotonic())

    def on_envelope(self, msg: EnvelopeStatus) -> None:
        self.envelope = msg

    def on_tick(self) -> None:
        trial = self._trial
        if trial is None:
            return
        now = time.monotonic()
        try:
            observation = self.assembler.assemble(now)
            action = self.loop.step(observation)
        except StaleObservation as error:
            # A late joint state skips this step (the policy is not stepped, nothing is
            # sent); one that stays missing ends the trial.
            self.stale_skips += 1
            if now - trial.setdefault("stale_since", now) > STALE_ABORT_PERIODS / self.loop.spec.rate_hz:
                self._finish(False, f"stopped: {error}")
            return
        except FloatingPointError as error:
            return self._finish(False, f"stopped: {error}")
        trial.pop("stale_since", None)
        msg = JointState(name=list(self.loop.spec.action_joints), position=action)
        msg.header.stamp = self.get_clock().now().to_msg()
        self.command_pub.publish(msg)
        elapsed = now - trial["start"]
        if self.envelope.state == EnvelopeStatus.STATE_FAULT:
            self._finish(False, f"envelope fault {self.envelope.fault}: {self.envelope.reason}")
        elif trial["judge"] and goal_reached(self.loop.spec, self.assembler.positions()):
            self._finish(True, "goal reached")
        elif trial["timeout_s"] > 0 and elapsed > trial["timeout_s"]:
            self._finish(False, f"timeout after {elapsed:.1f} s")

    def _finish(self, success: bool, reason: str) -> None:
        done = self._trial["done"]
        self.deactivate()
        if not done.done():
            done.set_result((success, reason))

    def _autostart_once(self) -> None:
        if not self.assembler.positions():
            return  # wait for the first joint state
        if self._trial is None and self._timer is None and not getattr(self, "_autostarted", False):
            self._autostarted = True
            self.executor.create_task(self._autostart())

    async def _autostart(self) -> None:
        try:
            await self._set_armed(True)
        except TrialFailed as error:
            self.get_logger().error(f"autostart: {error}")
            return
        done = Future()
        self._start_stepping(done, 0.0, judge=False)
        success, reason = await done
        self.get_logger().info(f"autostarted policy ended: {reason}")

    # ---------------------------------------------------------------- services
    async def _call(self, client, request, what: str):
        deadline = time.monotonic() + SERVICE_WAIT_S
        while not client.service_is_ready():  # polled: a blocking wait would stall the executor
            if time.monotonic() > deadline:
                raise TrialFailed(ErrorCode.NOT_READY, f"{what}: service {client.srv_name} is not available")
            await self._sleep(0.1)
        return await client.call_async(request)

    async def _set_armed(self, armed: bool) -> None:
        if not self.p["arm_monitor"]:
            return
        response = await self._call(self.arm_client, SetArmed.Request(armed=armed), "arming the envelope monitor")
        if response.error.code != ErrorCode.NONE:
            raise TrialFailed(ErrorCode.ENVELOPE_VIOLATION, f"envelope monitor refused to arm: {response.error.message}")

    async def _sleep(self, seconds: float) -> None:
        done = Future()
        timer = self.create_timer(seconds, lambda: done.done() or done.set_result(None))
        await done
        self.destroy_timer(timer)

    async def _reset_scene(self, index: int) -> None:
        if self.envelope.state == EnvelopeStatus.STATE_FAULT:
            if not self.p["simulated"]:
                raise TrialFailed(ErrorCode.ENVELOPE_VIOLATION, "the envelope monitor holds a fault: check the cell "
                                  f"and reset it ({self.p['monitor_node']}/reset_fault) before more trials")
            await self._call(self.fault_client, ResetFault.Request(operator_note="runner: simulated trial reset"),
                             "clearing the envelope fault")
        await self._set_armed(False)
        if self.p["simulated"]:
            response = await self._call(self.reset_client, ResetWorkcell.Request(reset_box=True), "resetting the scene")
            if response.error.code != ErrorCode.NONE:
                raise TrialFailed(response.error.code, f"scene reset failed: {response.error.message}")
        else:
            response = await self._call(self.operator_client, ConfirmReset.Request(
                prompt=f"reset the scene for trial {index}, then confirm", trial_index=index), "asking the operator")
            if not response.confirmed:
                raise TrialFailed(ErrorCode.CANCELED, f"operator declined the reset: {response.operator_note}")
        await self._sleep(self.p["settle_s"])

    # ---------------------------------------------------------------- action
    async def execute(self, goal_handle) -> RunTrials.Result:
        goal, result = goal_handle.request, RunTrials.Result()
        try:
            if goal.policy_path:
                self.activate(goal.policy_path)
            if self.loop is None:
                raise TrialFailed(ErrorCode.INVALID_ARGUMENT, "no policy: give policy_path in the goal")
            if goal.split not in (SessionId.SPLIT_FIT, SessionId.SPLIT_HELD_OUT):
                raise TrialFailed(ErrorCode.WRONG_SPLIT, f"split {goal.split!r}: use 'fit' or 'held_out'")
            spec = self.loop.spec
            base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{spec.name}"
            for index in range(goal.num_trials):
                if goal_handle.is_cancel_requested:
                    goal_handle.canceled()
                    result.error = ErrorCode(code=ErrorCode.CANCELED, message=f"canceled before trial {index}")
                    return result
                goal_handle.publish_feedback(RunTrials.Feedback(trial_index=index, status="resetting"))
                await self._reset_scene(index)
                bag_path = ""
                if goal.record:
                    goal_handle.publish_feedback(RunTrials.Feedback(trial_index=index, status="recording"))
                    bag_path = await self._start_recording(goal, spec, f"{base}-t{index:03d}", index)
                goal_handle.publish_feedback(RunTrials.Feedback(trial_index=index, status="running"))
                started = time.monotonic()
                await self._set_armed(True)
                done = Future()
                self._start_stepping(done, goal.trial_timeout_s or spec.trial_timeout_s)
                success, reason = await done
                duration = time.monotonic() - started
                await self._set_armed(False)
                if goal.record:
                    response = await self._call(self.stop_client, StopRecording.Request(), "stopping the recording")
                    bag_path = response.bag_path or bag_path
                result.outcomes.append(TrialOutcome(trial_index=index, success=success, reason=reason,
                                                    duration_s=duration, bag_path=bag_path))
                self.get_logger().info(f"trial {index}: {'success' if success else 'failure'} ({reason}); "
                                       f"{self.stale_skips} steps skipped on stale observations so far")
        except (PolicySpecError, PolicyMismatch) as error:
            result.error = ErrorCode(code=ErrorCode.SPEC_MISMATCH, message=str(error))
        except TrialFailed as error:
            result.error = ErrorCode(code=error.code, message=str(error))
        finally:
            self.deactivate()
        if result.error.code != ErrorCode.NONE:
            self.get_logger().error(result.error.message)
            goal_handle.abort()
        else:
            goal_handle.succeed()
        return result

    async def _start_recording(self, goal, spec, session_id: str, index: int) -> str:
        request = StartRecording.Request(
            profile=self.p["record_profile"], output_dir=self.p["bag_dir"],
            session=SessionId(session_id=session_id, purpose=SessionId.PURPOSE_TRIAL, split=goal.split,
                              trial_index=index),
            twin_version=self.p["twin_version"] or spec.twin_version, policy_version=spec.policy_version,
            operator_note=f"policy runner trial {index} of {goal.num_trials}")
        response = await self._call(self.start_client, request, "starting the recording")
        if response.error.code != ErrorCode.NONE:
            raise TrialFailed(response.error.code, f"recorder refused trial {index}: {response.error.message}")
        # A trial bag without the robot's topics cannot be judged. The recorder subscribes
        # to a topic once it has discovered a publisher of it, which can take a moment after
        # it starts; the trial waits for that instead of running unrecorded.
        deadline = time.monotonic() + self.p["record_ready_timeout_s"]
        while True:
            missing = not_yet_recorded(self.recorder_status, response.bag_path, self.p["record_required_topics"])
            if not missing:
                return response.bag_path
            if time.monotonic() > deadline:
                await self._call(self.stop_client, StopRecording.Request(), "stopping the recording")
                raise TrialFailed(ErrorCode.NOT_READY, (
                    f"trial {index}: the recorder found no publisher of {missing} within "
                    f"{self.p['record_ready_timeout_s']:.1f} s, so the trial was not run; check that the robot "
                    f"driver and the envelope monitor are up on this ROS_DOMAIN_ID (bag kept: {response.bag_path})"))
            await self._sleep(0.05)

    def destroy_node(self) -> None:
        # Stop safely: command the measured position once (the robot stops where it is),
        # then stop stepping; the monitor's command watchdog holds it after that.
        if self._timer is not None and self.assembler is not None:
            measured = self.assembler.positions()
            joints = [j for j in self.loop.spec.action_joints if j in measured]
            try:
                msg = JointState(name=joints, position=[measured[j] for j in joints])
                msg.header.stamp = self.get_clock().now().to_msg()
                self.command_pub.publish(msg)
                if self.p["arm_monitor"] and self.arm_client.service_is_ready():
                    self.arm_client.call_async(SetArmed.Request(armed=False))
            except Exception:  # noqa: BLE001 - the context may already be gone
                pass
        self.deactivate()
        super().destroy_node()


def main(args=None) -> None:
    run_node(PolicyRunnerNode, args, executor=make_executor())


if __name__ == "__main__":
    main()
