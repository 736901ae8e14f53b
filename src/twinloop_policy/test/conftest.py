"""An in-process workcell for the runner's core: the emulated workcell's simulation (true
physics and sensor noise) behind the envelope monitor's core (twinloop_safety.envelope),
stepped on a simulated clock, with the policy stepped at its rate. The recorder is a
stand-in that keeps the sessions it was asked for and records the topics it is told to."""
from __future__ import annotations

import numpy as np
import pytest

from twinloop_policy.runner import ObservationAssembler, PolicyLoop, PolicyRun, load_module
from twinloop_policy.trials import TrialPlan
from twinloop_safety.envelope import Box, EnvelopeMonitor, State, build_limits
from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.physics import COMMANDED_JOINTS, load_physics
from twinloop_twin.workcell import default_config_dir, load_workcell

JOINT_STATE_PERIOD_S = 0.002  # the emulated workcell's 500 Hz


class SimulatedCell:
    """twinloop_policy.trials.TrialCell in-process; `calls` logs what was done, in order."""

    def __init__(self, workcell, physics, kinematics) -> None:
        self.sim = WorkcellSimulation(workcell, physics, seed=0)
        # config/envelope.yaml's limits (watchdogs 0.5 s)
        limits = build_limits(
            kinematics, joint_names=list(COMMANDED_JOINTS), position_margins=[0.05] * 7 + [0.0], velocity_scale=0.5,
            acceleration_limits=[7.5, 3.75, 5.0, 6.25, 7.5, 10.0, 10.0, 1.0], max_target_lead=[0.25] * 7 + [0.04],
            command_period_s=0.004, limit_mode="reject", workspace=Box("workspace", (-0.35, -0.55, 0.755),
                                                                       (0.85, 0.55, 1.75)),
            keep_out=(Box("static_camera_stand", (0.9, 0.2, 0.75), (1.1, 0.4, 1.45)),), cartesian_margin_m=0.02,
            checked_links=("panda_link4", "panda_link6", "panda_link7", "panda_hand", "panda_hand_tcp"),
            sample_spacing_rad=0.02, max_force_n=60.0, command_timeout_s=0.5, joint_state_timeout_s=0.5)
        self.monitor = EnvelopeMonitor(limits, kinematics)
        self.calls: list[str] = []
        self.sessions: list[tuple[str, int, str]] = []  # (session id, trial index, split)
        self.recorded_topics = ("/joint_states", "/joint_command")
        self.operator_confirms = True
        self.operator_notes: list[str] = []  # what the operator was told with each reset
        self.scene = None  # the planning scene of move_to_start, built at its first call
        self.reset_path: list[dict] = []
        self.reset_forwarded = 0
        self.policy: tuple[PolicyLoop, ObservationAssembler] | None = None
        self.sent: list[list[float]] = []  # what the policy sent
        self.forwarded: list[list[float]] = []  # what the monitor let through
        self.on_stop_recording = lambda: None
        # the box tracker's report of the box's true (x, y) (None: none yet): a policy that
        # observes the box gets it
        self.box_observer = lambda x, y: (x, y)
        self._state()

    def load(self, spec) -> None:
        self.policy = PolicyLoop(spec, load_module(spec)), ObservationAssembler(spec)

    def now_s(self) -> float:
        return self.sim.time_s

    def _state(self) -> None:
        sample = self.sim.joint_state()
        now = self.sim.time_s
        self.monitor.on_joint_state(sample.names, sample.position, sample.velocity, now)
        if self.policy is not None:
            self.policy[1].on_joint_state(sample.names, sample.position, sample.velocity, now)
            for term in self.policy[0].spec.observation:
                if term.kind == "box_position":
                    box = self.sim.box_qpos()
                    seen = self.box_observer(box[0], box[1])
                    if seen is not None:  # None: the tracker has not reported
                        self.policy[1].on_box_position(term.topic, *seen, now)

    def _advance(self) -> None:
        self.sim.step_until(self.sim.time_s + JOINT_STATE_PERIOD_S)
        self._state()
        self.monitor.tick(self.sim.time_s)

    # ------------------------------------------------------------ TrialCell
    def monitor_faulted(self) -> bool:
        return self.monitor.state is State.FAULT

    def clear_fault(self, note: str) -> None:
        self.calls.append("clear_fault")
        self.monitor.reset_fault()

    def set_armed(self, armed: bool) -> None:
        self.calls.append("arm" if armed else "disarm")
        if armed:
            refused = self.monitor.arm()
            assert not refused, refused
        else:
            self.monitor.disarm()

    def move_to_start(self) -> tuple[bool, str]:
        """The real planner (twinloop_planning) in the workcell's scene, to home, streamed
        through the monitor's core at its command period; the arm's positions at each
        command are kept in `reset_path`."""
        from twinloop_planning.planner import PlanningError, plan
        from twinloop_planning.scene import PlanningScene, SceneSettings

        self.calls.append("move_to_start")
        if self.scene is None:
            self.scene = PlanningScene.from_workcell(load_workcell(), settings=SceneSettings(allowed=("box",)))
        names = list(self.scene.joint_names)
        measured = self.sim.true_joint_positions()
        start = np.clip([measured[j] for j in names], self.scene.lower, self.scene.upper)
        home = load_workcell().home_joint_positions
        try:
            trajectory = plan(start, [home[j] for j in names], self.scene)
        except PlanningError as error:
            return False, f"no plan ({error.code}): {error}"
        refused = self.monitor.arm()
        assert not refused, refused
        self.reset_path = []
        for target in trajectory.positions:
            decision = self.monitor.check_command(names, target, self.sim.time_s)
            if decision.forward is None:
                return False, f"the monitor stopped the move: {decision.violation or decision.rejected_quietly}"
            self.sim.command(decision.names, decision.forward)
            self.reset_forwarded += 1
            self.reset_path.append(dict(self.sim.true_joint_positions()))
            for _ in range(2):  # 4 ms per command, joint states every 2 ms
                self._advance()
        for _ in range(75):  # 0.3 s holding the goal: the arm settles
            self.monitor.check_command(names, trajectory.positions[-1], self.sim.time_s)
            self._advance()
            self._advance()
        self.reset_path.append(dict(self.sim.true_joint_positions()))
        self.monitor.disarm()
        return True, f"{trajectory.duration_s:.1f} s, sampled {trajectory.sampled}"

    def reset_scene(self) -> None:
        self.calls.append("reset_scene")
        self.sim.reset()
        self._state()

    def confirm_reset(self, index: int, note: str = "") -> tuple[bool, str]:
        self.calls.append("confirm_reset")
        self.operator_notes.append(note)
        return self.operator_confirms, "" if self.operator_confirms else "the box fell off the table"

    def start_recording(self, session_id: str, index: int, plan: TrialPlan) -> str:
        self.calls.append("start_recording")
        self.sessions.append((session_id, index, plan.split))
        return f"bags/{session_id}"

    def wait_until_recording(self, bag_path, topics, timeout_s) -> list[str]:
        return sorted(set(topics) - set(self.recorded_topics))

    def stop_recording(self) -> str:
        self.calls.append("stop_recording")
        self.on_stop_recording()
        return f"bags/{self.sessions[-1][0]}"

    def observations_missing(self) -> str:
        return self.policy[1].missing(self.sim.time_s)

    def run_policy(self, timeout_s: float) -> tuple[bool, str]:
        self.calls.append("run_policy")
        loop, assembler = self.policy
        run = PolicyRun(loop, assembler, timeout_s)
        period = 1.0 / loop.spec.rate_hz
        due = self.sim.time_s
        while not run.done.is_set():
            if self.sim.time_s >= due - 1e-9:
                due += period
                fault = self.monitor.fault.reason if self.monitor_faulted() else ""
                action = run.step(self.sim.time_s, fault)
                if action is not None:
                    self.sent.append(list(action))
                    decision = self.monitor.check_command(loop.spec.action_joints, action, self.sim.time_s)
                    if decision.forward is not None:
                        self.forwarded.append(decision.forward)
                        self.sim.command(decision.names, decision.forward)
            self._advance()
        return run.outcome

    def sleep(self, seconds: float) -> None:
        end = self.sim.time_s + seconds
        while self.sim.time_s < end - 1e-9:
            self._advance()


@pytest.fixture(scope="session")
def workcell():
    return load_workcell()


@pytest.fixture(scope="session")
def kinematics(workcell):
    return UrdfTransforms(workcell.urdf_xml)


@pytest.fixture
def cell(workcell, kinematics):
    return SimulatedCell(workcell, load_physics(default_config_dir() / "emulated_truth.yaml"), kinematics)
