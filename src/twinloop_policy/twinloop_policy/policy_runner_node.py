"""Policy runner: runs an exported policy at its rate, through the envelope monitor.

Refuses a policy that does not match the robot; steps it on a timer from /joint_states
(and the box tracker's pose, for a policy that observes the box);
publishes targets to /twinloop/policy/command (never the hardware topic); serves
~/run_trials. The core is policy_spec.py, runner.py (PolicyRun) and trials.py (the trial
sequence). Not a lifecycle node: a policy is loaded at startup or by a goal.

Threads: one executor thread (the EventsExecutor where available: ~0.2 ms p99 timer jitter
at 250-500 Hz) runs the inference timer and delivers every service response. The trial
sequence blocks on twinloop_ros.clients, so it runs in a worker thread that execute (a
coroutine) only polls; nothing blocks the executor thread.
"""
from __future__ import annotations

import math
import threading
import time

from geometry_msgs.msg import PoseWithCovarianceStamped
from rclpy.action import ActionServer, CancelResponse
from rclpy.node import Node
from sensor_msgs.msg import JointState
from twinloop_interfaces.action import RunTrials
from twinloop_interfaces.msg import ErrorCode, TrialOutcome

from twinloop_policy.policy_spec import PolicyMismatch, PolicySpecError, check_against_robot, load_policy_spec
from twinloop_policy.runner import ObservationAssembler, PolicyLoop, PolicyRun, load_module
from twinloop_policy.trial_cell_node import RosTrialCell
from twinloop_policy.trials import TrialFailed, TrialPlan, TrialSequence
from twinloop_ros.node import StartupError, declare, make_executor, run_node, sleep
from twinloop_ros.qos import COMMANDS, RELIABLE
from twinloop_twin.physics import ALL_JOINTS, COMMANDED_JOINTS


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
            "stale_abort_s": (0.5, "s, a running trial whose observations stay stale this long stops (until "
                              "then its steps are skipped); the envelope monitor's joint_state_timeout_s"),
            "judge_wait_s": (5.0, "s, a box goal is judged by a tracker pose of the box at rest received after "
                             "the trial's timeout; wait this long for one (the policy still stepped, its targets "
                             "sent), then judge by the last, why said"),
            "judge_settle_m": (0.003, "m, a box is at rest when a tracker pose is within this of the one before "
                               "it (the tracker's noise at rest is under 1 mm)"),
            "observation_timeout_s": (15.0, "s, wait after settle_s for every observation term's first value "
                                       "(e.g. the box tracker's pose, once over 5 s on a node set just started); a trial "
                                       "without one is not run"),
            "recorder_node": ("/recorder", "recorder whose start/stop services record the trials"),
            "record_profile": ("trial", "recording profile of each trial"),
            "record_required_topics": (["/joint_states", "/joint_command"],
                                       "topics the recorder must be recording before a trial starts"),
            "record_ready_timeout_s": (5.0, "s, wait for the recorder to find required topics' publishers"),
            "bag_dir": ("", "parent folder of the trial bags; empty: the recorder's default"),
            "twin_version": ("", "twin in use, recorded with each trial (e.g. emulated/v0)"),
            "planned_reset": (True, "before each trial, bring the arm to start_pose along a collision-free path "
                              "planned in the workcell's scene (twinloop_planning), through the monitor"),
            "start_pose": ([0.0], "joint positions of the trial's start, in the envelope's joint order "
                           "(panda_joint1..7 rad, panda_finger_joint1 m); [0.0] or empty: the workcell's home pose"),
            "planning_topic": ("/twinloop/planning/command", "the monitor's input the reset move is streamed on"),
            "envelope_config": ("", "the envelope monitor's parameter file the reset is planned within; empty: "
                                "config/envelope.yaml"),
            "planning_config": ("", "planner settings (config/planning.yaml format); empty: config/planning.yaml"),
        })
        self.loop: PolicyLoop | None = None
        self.assembler: ObservationAssembler | None = None
        self._timer = None
        self._box_subscriptions: dict[str, object] = {}
        self._run: PolicyRun | None = None
        if not (math.isfinite(self.p["stale_abort_s"]) and self.p["stale_abort_s"] > 0.0):
            raise StartupError(f"stale_abort_s {self.p['stale_abort_s']}: give a finite time > 0 (s; the envelope "
                               "monitor's joint_state_timeout_s, 0.5, is the default)")
        for name, least in (("settle_s", 0.0), ("judge_wait_s", 0.0), ("judge_settle_m", None),
                            ("observation_timeout_s", None),
                            ("record_ready_timeout_s", None)):
            value = self.p[name]  # a NaN wait never ends a trial's start; a negative one skips it
            if not (math.isfinite(value) and (value >= least if least is not None else value > 0.0)):
                what, unit = ("distance", "m") if name.endswith("_m") else ("time", "s")
                raise StartupError(f"{name} {value}: give a finite {what} {'>= 0' if least is not None else '> 0'} "
                                   f"({unit}; config/policy_runner.yaml has the default)")
        self._closing = False
        self.stale_skips = 0
        # Commands: each message is one step of the monitor (the COMMANDS profile says why).
        self.command_pub = self.create_publisher(JointState, self.p["command_topic"], COMMANDS)
        self.create_subscription(JointState, self.p["joint_states_topic"], self.on_joint_state, RELIABLE)
        self.cell = RosTrialCell(self, monitor=self.p["monitor_node"], recorder=self.p["recorder_node"],
                                 reset_service=self.p["reset_service"], operator_service=self.p["operator_service"],
                                 bag_dir=self.p["bag_dir"], record_profile=self.p["record_profile"],
                                 run_policy=self.run_policy, observations_missing=self.observations_missing)
        if self.p["planned_reset"]:
            self.cell.start_mover = self._start_mover()
        ActionServer(self, RunTrials, "~/run_trials", execute_callback=self.execute,
                     cancel_callback=lambda _: CancelResponse.ACCEPT)
        if self.p["policy_path"]:
            try:
                self.load_policy(self.p["policy_path"])
            except (PolicySpecError, PolicyMismatch) as error:
                raise StartupError(str(error)) from error
            if self.p["autostart"]:
                self._autostart_timer = self.create_timer(0.2, self._autostart_once)
        self.get_logger().info("policy runner up" + (f": {self.loop.spec.policy_version} at "
                                                     f"{self.loop.spec.rate_hz:.0f} Hz" if self.loop else ""))

    def _start_mover(self):
        """The planner the trial resets use: the workcell description's scene (the box may be
        touched: it is put back with the scene) within the monitor's envelope."""
        from dataclasses import replace

        import numpy as np
        from twinloop_planning.config import PlanningConfigError, load_planning_config
        from twinloop_planning.mover_node import LiveMover
        from twinloop_planning.planner import PlanningError
        from twinloop_planning.scene import PlanningScene
        from twinloop_twin.workcell import load_workcell

        try:
            settings, scene_settings = load_planning_config(self.p["planning_config"] or None)
            workcell = load_workcell()
            scene = PlanningScene.from_workcell(workcell, self.p["envelope_config"] or None,
                                                replace(scene_settings, allowed=tuple(scene_settings.allowed) + ("box",)))
        except (PlanningConfigError, PlanningError, OSError, ValueError) as error:
            raise StartupError(f"planned_reset: {error}; fix the file or set planned_reset false") from None
        pose = [float(v) for v in self.p["start_pose"]]
        if pose in ([], [0.0]):
            pose = [workcell.home_joint_positions[j] for j in scene.joint_names]
        if len(pose) != len(scene.joint_names):
            raise StartupError(f"start_pose has {len(pose)} values: give {len(scene.joint_names)} "
                               f"({', '.join(scene.joint_names)})")
        problem = scene.problem(pose)
        if problem is not None:
            raise StartupError(f"start_pose {pose} is not a valid state to plan to: {problem}")
        # the positions the runner's own joint-state subscription keeps (no second one at 500 Hz)
        mover = LiveMover(self, scene, settings, self.cell.envelope, command_topic=self.p["planning_topic"],
                          joint_states=self.p["joint_states_topic"],
                          positions=lambda: self.assembler.positions() if self.assembler is not None else {})
        return mover, np.array(pose)

    def load_policy(self, policy_path: str) -> None:
        """Load and check a policy folder and make it the one stepped (executor thread only)."""
        spec = load_policy_spec(policy_path)
        check_against_robot(spec, commandable=COMMANDED_JOINTS, measured=ALL_JOINTS,
                            joint_state_rate_hz=self.p["joint_state_rate_hz"])
        self.loop, self.assembler = PolicyLoop(spec, load_module(spec)), ObservationAssembler(spec)
        for topic in {t.topic for t in spec.observation if t.kind == "box_position"} - set(self._box_subscriptions):
            self._box_subscriptions[topic] = self.create_subscription(
                PoseWithCovarianceStamped, topic, lambda msg, topic=topic: self.on_box_pose(topic, msg), RELIABLE)
        self._set_timer(False)

    def _set_timer(self, on: bool) -> None:
        """The inference timer at the policy's rate (created and destroyed in the executor thread)."""
        if self._timer is not None:
            self.destroy_timer(self._timer)
            self._timer = None
        if on:
            self._timer = self.create_timer(1.0 / self.loop.spec.rate_hz, self.on_tick)

    def run_policy(self, timeout_s: float, judge: bool = True) -> tuple[bool, str]:
        """Step the policy from its reset until done (worker thread: blocks until then)."""
        run = self._run = PolicyRun(self.loop, self.assembler, timeout_s, judge, stale_abort_s=self.p["stale_abort_s"],
                                         judge_wait_s=self.p["judge_wait_s"], judge_settle_m=self.p["judge_settle_m"])
        outcome = run.wait(stop=lambda: self._closing)
        self.stale_skips += run.stale_skips
        return outcome

    def observations_missing(self) -> str:
        return self.assembler.missing(time.monotonic()) if self.assembler is not None else "no policy loaded"

    def on_joint_state(self, msg: JointState) -> None:
        if self.assembler is not None:
            self.assembler.on_joint_state(msg.name, msg.position, msg.velocity, time.monotonic())

    def on_box_pose(self, topic: str, msg: PoseWithCovarianceStamped) -> None:
        if self.assembler is not None:
            position = msg.pose.pose.position
            self.assembler.on_box_position(topic, position.x, position.y, time.monotonic())

    def on_tick(self) -> None:
        run = self._run
        if run is None:
            return
        action = run.step(time.monotonic(), self.cell.envelope.fault_text())
        if action is not None:
            msg = JointState(name=list(self.loop.spec.action_joints), position=action)
            msg.header.stamp = self.get_clock().now().to_msg()
            self.command_pub.publish(msg)
        if run.done.is_set() and self._run is run:
            self._run = None

    def _autostart_once(self) -> None:
        if self.assembler.positions():  # the first joint state is in
            self._autostart_timer.cancel()
            self._set_timer(True)
            threading.Thread(target=self._autostart, name="autostart", daemon=True).start()

    def _autostart(self) -> None:
        try:
            if self.p["arm_monitor"]:
                self.cell.set_armed(True)
        except TrialFailed as error:
            self.get_logger().error(f"autostart: {error}")
            return
        self.get_logger().info(f"autostarted policy ended: {self.run_policy(0.0, judge=False)[1]}")

    async def execute(self, goal_handle) -> RunTrials.Result:
        result = RunTrials.Result()
        try:
            if goal_handle.request.policy_path:
                self.load_policy(goal_handle.request.policy_path)
            if self.loop is None:
                raise TrialFailed("INVALID_ARGUMENT", "no policy: give policy_path in the goal")
            sequence = self._sequence(goal_handle.request)
            await self._run_in_worker(goal_handle, sequence)
            result.outcomes = [TrialOutcome(trial_index=o.index, success=o.success, reason=o.reason,
                                            duration_s=o.duration_s, bag_path=o.bag_path) for o in sequence.outcomes]
            if sequence.error is not None:
                raise sequence.error
        except (PolicySpecError, PolicyMismatch) as error:
            result.error = ErrorCode(code=ErrorCode.SPEC_MISMATCH, message=str(error))
        except TrialFailed as error:
            result.error = ErrorCode(code=getattr(ErrorCode, error.code, ErrorCode.UNKNOWN), message=str(error))
        if result.error.code == ErrorCode.CANCELED and goal_handle.is_cancel_requested:
            goal_handle.canceled()
        elif result.error.code != ErrorCode.NONE:
            self.get_logger().error(result.error.message)
            goal_handle.abort()
        else:
            goal_handle.succeed()
        return result

    def _sequence(self, goal) -> TrialSequence:
        spec = self.loop.spec
        plan = TrialPlan(
            policy_name=spec.name, policy_version=spec.policy_version, twin_version=self.p["twin_version"]
            or spec.twin_version, num_trials=goal.num_trials, split=goal.split, record=goal.record,
            timeout_s=goal.trial_timeout_s or spec.trial_timeout_s, simulated=self.p["simulated"],
            settle_s=self.p["settle_s"], required_topics=tuple(self.p["record_required_topics"]),
            record_ready_timeout_s=self.p["record_ready_timeout_s"], arm_monitor=self.p["arm_monitor"],
            observation_timeout_s=self.p["observation_timeout_s"], planned_reset=self.p["planned_reset"])
        return TrialSequence(plan, self.cell, log=lambda m: self.get_logger().info(
            f"{m}; {self.stale_skips} steps skipped on stale observations so far"))

    async def _run_in_worker(self, goal_handle, sequence: TrialSequence) -> None:
        """The sequence in its worker thread; this coroutine relays its feedback and a cancel."""
        self._set_timer(True)
        worker = sequence.start()
        try:
            while worker.is_alive() or sequence.updates:
                while sequence.updates:
                    index, status = sequence.updates.popleft()
                    goal_handle.publish_feedback(RunTrials.Feedback(trial_index=index, status=status))
                if goal_handle.is_cancel_requested:
                    sequence.cancel.set()
                await sleep(self, 0.05)
        finally:
            self._set_timer(False)

    def destroy_node(self) -> None:
        # Stop safely: command the measured position once (the robot stops where it is), ask
        # the monitor to disarm; its command watchdog holds the robot after that in any case.
        self._closing = True
        if self._run is not None:
            measured = self.assembler.positions()
            joints = [j for j in self.loop.spec.action_joints if j in measured]
            try:
                msg = JointState(name=joints, position=[measured[j] for j in joints])
                msg.header.stamp = self.get_clock().now().to_msg()
                self.command_pub.publish(msg)
                if self.p["arm_monitor"]:
                    self.cell.envelope.disarm_nowait()
            except Exception:  # noqa: BLE001 - the context may already be gone
                pass
        self._run = None
        super().destroy_node()


def main(args=None) -> None:
    run_node(PolicyRunnerNode, args, executor=make_executor())


if __name__ == "__main__":
    main()
