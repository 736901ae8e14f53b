"""The trial sequence of the policy runner, without ROS: per trial, make the cell safe and
reset the scene, start the recording (and wait until it records the robot), arm the
envelope monitor, run the policy until goal, timeout or fault, disarm, stop the recording.

Pure Python (no rclpy). The runner node supplies a `TrialCell` that does each step over
ROS; a test supplies one that does it in-process. Errors are `TrialFailed` with the name
of a twinloop_interfaces/ErrorCode constant and a message that says what to do.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

SPLITS = ("fit", "held_out")


class TrialFailed(RuntimeError):
    """The trials cannot go on; `code` names the twinloop_interfaces/ErrorCode constant."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class TrialPlan:
    """What one ~/run_trials goal asks for, with the runner's settings."""

    policy_name: str
    policy_version: str  # name@version, recorded with each trial
    twin_version: str
    num_trials: int
    split: str  # fit | held_out
    record: bool
    timeout_s: float  # per trial
    simulated: bool = True  # reset the scene ourselves; else the operator does, and clears faults
    settle_s: float = 0.5  # after a scene reset
    required_topics: tuple[str, ...] = ("/joint_states", "/joint_command")
    record_ready_timeout_s: float = 5.0
    arm_monitor: bool = True
    observation_timeout_s: float = 15.0  # wait for every observation term's first value
    planned_reset: bool = False  # bring the arm to its start pose along a planned path before each trial


@dataclass(frozen=True)
class TrialOutcome:
    index: int
    success: bool
    reason: str
    duration_s: float
    bag_path: str = ""


class TrialCell(Protocol):
    """What the trial sequence does to the cell; every call blocks until it is done."""

    def monitor_faulted(self) -> bool: ...

    def clear_fault(self, note: str) -> None: ...

    def set_armed(self, armed: bool) -> None: ...

    def move_to_start(self) -> tuple[bool, str]: ...  # the arm to its start pose, planned: (moved, what happened)

    def reset_scene(self) -> None: ...  # simulation: put robot and box back

    def confirm_reset(self, index: int, note: str = "") -> tuple[bool, str]: ...  # hardware: (confirmed, operator note)

    def start_recording(self, session_id: str, index: int, plan: TrialPlan) -> str: ...  # the bag path

    def wait_until_recording(self, bag_path: str, topics: Sequence[str], timeout_s: float) -> list[str]: ...

    def stop_recording(self) -> str: ...

    def observations_missing(self) -> str: ...  # why the policy's observation is not complete yet ('' when it is)

    def run_policy(self, timeout_s: float) -> tuple[bool, str]: ...  # from the policy's reset: (success, reason)

    def sleep(self, seconds: float) -> None: ...


def check_plan(plan: TrialPlan) -> None:
    if plan.split not in SPLITS:
        raise TrialFailed("WRONG_SPLIT", f"split {plan.split!r}: use 'fit' or 'held_out'")
    if plan.num_trials < 0:
        raise TrialFailed("INVALID_ARGUMENT", f"num_trials {plan.num_trials}: give 0 or more")


@dataclass
class TrialSequence:
    """Runs the plan's trials on the cell. `outcomes` holds those that ran (also after an
    error), `updates` the (trial index, status) feedback not yet taken (status: resetting,
    recording, running); setting `cancel` stops the sequence before the next trial."""

    plan: TrialPlan
    cell: TrialCell
    log: Callable[[str], None] = lambda message: None
    clock: Callable[[], float] = time.monotonic  # s, the durations' clock
    outcomes: list[TrialOutcome] = field(default_factory=list)
    updates: deque = field(default_factory=deque)
    cancel: threading.Event = field(default_factory=threading.Event)
    error: TrialFailed | None = None  # how start()'s thread ended (None: every trial ran)

    def run(self) -> list[TrialOutcome]:
        """Raises TrialFailed (CANCELED when cancelled between trials)."""
        check_plan(self.plan)
        base = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + f"-{self.plan.policy_name}"
        for index in range(self.plan.num_trials):
            if self.cancel.is_set():
                raise TrialFailed("CANCELED", f"canceled before trial {index}")
            self.outcomes.append(self.trial(index, f"{base}-t{index:03d}"))
        return self.outcomes

    def start(self) -> threading.Thread:
        """run() in a worker thread (the cell's calls block); how it ended goes to `error`."""
        def work() -> None:
            try:
                self.run()
            except TrialFailed as error:
                self.error = error
            except Exception as error:  # noqa: BLE001 - a goal must always end with a result that says why
                self.error = TrialFailed("UNKNOWN", f"{type(error).__name__}: {error}")

        thread = threading.Thread(target=work, name="trials", daemon=True)
        thread.start()
        return thread

    def trial(self, index: int, session_id: str) -> TrialOutcome:
        plan, cell = self.plan, self.cell
        self.updates.append((index, "resetting"))
        self.reset(index)
        self.wait_for_observations(index)
        bag_path = ""
        if plan.record:
            self.updates.append((index, "recording"))
            bag_path = self.start_recording(index, session_id)
        self.updates.append((index, "running"))
        started = self.clock()
        try:
            self.arm(True)
            success, reason = cell.run_policy(plan.timeout_s)
        finally:
            duration = self.clock() - started
            try:
                self.arm(False)
            finally:
                if plan.record:  # the bag is closed whatever happened: nothing recorded is lost
                    bag_path = cell.stop_recording() or bag_path
        outcome = TrialOutcome(index, success, reason, duration, bag_path)
        self.log(f"trial {index}: {'success' if success else 'failure'} ({reason})")
        return outcome

    def reset(self, index: int) -> None:
        """A latched fault cleared (simulation only), the monitor disarmed, the arm brought to
        its start pose along a planned path (planned_reset; a move that cannot be planned or
        made is said, and left to the simulator's reset or the operator), the scene reset."""
        plan, cell = self.plan, self.cell
        self.clear_fault()
        self.arm(False)
        note = ""
        if plan.planned_reset:
            moved, what = cell.move_to_start()
            if moved:
                self.log(f"trial {index}: reset move {what}")
            else:
                self.log(f"trial {index}: no planned reset move: {what}; "
                         + ("the simulator puts the arm back" if plan.simulated else "the operator is asked to"))
                note = f"the arm was not moved to its start pose ({what}): move it there yourself"
                self.clear_fault()  # a move the monitor stopped
                self.arm(False)
        if plan.simulated:
            cell.reset_scene()
        else:
            confirmed, operator_note = cell.confirm_reset(index, note)
            if not confirmed:
                raise TrialFailed("CANCELED", f"operator declined the reset: {operator_note}")
        cell.sleep(plan.settle_s)

    def clear_fault(self) -> None:
        """A latched fault is cleared in simulation; on hardware the trials stop for the operator."""
        if self.cell.monitor_faulted():
            if not self.plan.simulated:
                raise TrialFailed("ENVELOPE_VIOLATION", "the envelope monitor holds a fault: check the cell and "
                                  "reset it (the monitor's ~/reset_fault) before more trials")
            self.cell.clear_fault("runner: simulated trial reset")

    def wait_for_observations(self, index: int) -> None:
        """Return once every observation term has a value (before arming: the monitor's
        command watchdog runs once it is armed). A box tracker publishes a few times a
        second, later after a reset or on a loaded host; a trial that started without it
        would stop at its first step."""
        deadline = self.clock() + self.plan.observation_timeout_s
        while (missing := self.cell.observations_missing()) and self.clock() < deadline:
            self.cell.sleep(0.05)
        if missing:
            raise TrialFailed("NOT_READY", f"trial {index} not run: after {self.plan.observation_timeout_s:.1f} s, "
                              f"{missing}")

    def start_recording(self, index: int, session_id: str) -> str:
        """Start the trial's session; return once the recorder records the required topics.

        A trial bag without the robot's topics cannot be judged. The recorder subscribes to
        a topic once it has discovered a publisher of it, which can take a moment after it
        starts; the trial waits for that instead of running unrecorded."""
        plan, cell = self.plan, self.cell
        bag_path = cell.start_recording(session_id, index, plan)
        missing = cell.wait_until_recording(bag_path, plan.required_topics, plan.record_ready_timeout_s)
        if missing:
            cell.stop_recording()
            raise TrialFailed("NOT_READY", (
                f"trial {index}: the recorder found no publisher of {missing} within "
                f"{plan.record_ready_timeout_s:.1f} s, so the trial was not run; check that the robot driver and "
                f"the envelope monitor are up on this ROS_DOMAIN_ID (bag kept: {bag_path})"))
        return bag_path

    def arm(self, armed: bool) -> None:
        if self.plan.arm_monitor:
            self.cell.set_armed(armed)
