"""The policy runner's core: load the module, assemble observations, step, judge a run.

Pure Python (torch, numpy; no rclpy). The node feeds joint states in and publishes what
`PolicyLoop.step` returns.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from twinloop_policy.policy_spec import PolicyMismatch, PolicySpec


class StaleObservation(RuntimeError):
    """An observation term is older than its max_age_s (or was never received)."""


def load_module(spec: PolicySpec) -> torch.jit.ScriptModule:
    """Load the TorchScript module and check it against its spec with one dry run."""
    try:
        module = torch.jit.load(str(spec.module_path), map_location="cpu")
    except (RuntimeError, ValueError) as error:
        raise PolicyMismatch([f"{spec.module_path} is not a loadable TorchScript module ({error})"],
                             str(spec.folder)) from error
    module.eval()
    probe = torch.zeros(spec.observation_size, dtype=torch.float64)
    try:
        with torch.no_grad():
            if hasattr(module, "reset"):
                module.reset()
            out = module(probe)
            if hasattr(module, "reset"):
                module.reset()
    except RuntimeError as error:
        raise PolicyMismatch([f"module refuses an observation of size {spec.observation_size} ({error})"],
                             str(spec.folder)) from error
    if tuple(out.shape) != (len(spec.action_joints),):
        raise PolicyMismatch([f"module returns shape {tuple(out.shape)}, spec's action has "
                              f"{len(spec.action_joints)} joints"], str(spec.folder))
    return module


class ObservationAssembler:
    """Latest joint state per joint and latest box position per topic, each with its
    receive time; assembled in spec order."""

    def __init__(self, spec: PolicySpec) -> None:
        self.spec = spec
        self._position: dict[str, float] = {}
        self._velocity: dict[str, float] = {}
        self._time_s: float = -np.inf
        self._box: dict[str, tuple[float, float, float]] = {}  # topic -> (x, y, receive time)

    def on_joint_state(self, names: Sequence[str], positions: Sequence[float], velocities: Sequence[float],
                       now_s: float) -> None:
        self._position.update(zip(names, positions))
        if len(velocities) == len(names):
            self._velocity.update(zip(names, velocities))
        self._time_s = now_s

    def on_box_position(self, topic: str, x: float, y: float, now_s: float) -> None:
        self._box[topic] = (float(x), float(y), now_s)

    def positions(self) -> dict[str, float]:
        return dict(self._position)

    def box_entry(self, topic: str | None = None) -> tuple[float, float, float] | None:
        """The latest box position (of `topic`, else of the spec's first box term) with its
        receive time (x, y, s), None before any."""
        if topic is None:
            topic = next((t.topic for t in self.spec.observation if t.kind == "box_position"), "")
        return self._box.get(topic)

    def missing(self, now_s: float) -> str:
        """Why assemble(now_s) would fail ('' when it would not)."""
        try:
            self.assemble(now_s)
        except StaleObservation as error:
            return str(error)
        return ""

    def assemble(self, now_s: float, box_age_checked: bool = True) -> np.ndarray:
        """The observation vector; `box_age_checked` False: a box pose of any age (the wait for
        the trial's judgement, when the box's last pose may be older than its max_age_s)."""
        parts = []
        for term in self.spec.observation:
            if term.kind == "box_position":
                entry = self._box.get(term.topic)
                if entry is None:
                    raise StaleObservation(f"observation '{term.name}' has no box pose yet from {term.topic}: "
                                           "is the box tracker running?")
                if box_age_checked and now_s - entry[2] > term.max_age_s:
                    raise StaleObservation(f"observation '{term.name}' is {(now_s - entry[2]) * 1e3:.0f} ms old "
                                           f"(max {term.max_age_s * 1e3:.0f} ms): check {term.topic}")
                parts.append([entry[0], entry[1]])
                continue
            age = now_s - self._time_s
            if age > term.max_age_s:
                raise StaleObservation(f"observation '{term.name}' is {age * 1e3:.1f} ms old "
                                       f"(max {term.max_age_s * 1e3:.1f} ms): check /joint_states")
            source = self._position if term.kind == "joint_position" else self._velocity
            missing = [j for j in term.joints if j not in source]
            if missing:
                raise StaleObservation(f"observation '{term.name}' has no value yet for {missing}")
            parts.append([source[j] for j in term.joints])
        return np.concatenate(parts).astype(np.float64)


@dataclass
class PolicyLoop:
    """One policy, stepped at its rate."""

    spec: PolicySpec
    module: torch.jit.ScriptModule

    def reset(self) -> None:
        if hasattr(self.module, "reset"):
            self.module.reset()

    def step(self, observation: np.ndarray) -> list[float]:
        with torch.no_grad():
            action = self.module(torch.from_numpy(observation)).tolist()
        if not all(np.isfinite(action)):
            # The envelope monitor would refuse it anyway; saying so here names the culprit.
            raise FloatingPointError(f"policy {self.spec.policy_version} returned non-finite targets {action}")
        return action


def goal_reached(spec: PolicySpec, measured: dict[str, float]) -> bool:
    """The joint goal (a policy with a box goal is judged at its trial's end instead)."""
    return bool(spec.goal_joint_positions) and all(abs(measured.get(j, np.inf) - g) <= spec.goal_tolerance_rad
                                                   for j, g in spec.goal_joint_positions.items())


def box_goal_outcome(spec: PolicySpec, box_xy: tuple[float, float] | None, note: str = "") -> tuple[bool, str]:
    """Success and the reason, for a policy whose trial goal is a box position."""
    if box_xy is None:
        return False, "no box pose to judge the goal by"
    distance = float(np.hypot(box_xy[0] - spec.goal_box_xy[0], box_xy[1] - spec.goal_box_xy[1]))
    within = distance <= spec.goal_radius_m
    return within, (f"box {distance * 100:.1f} cm from the goal ({'within' if within else 'outside'} "
                    f"{spec.goal_radius_m * 100:.1f} cm{'; ' + note if note else ''})")


@dataclass
class PolicyRun:
    """The policy stepped from its reset until done: goal reached (when judged), timeout
    (> 0), an envelope fault, a failing policy, or observations that stay stale.

    `step` is called at the policy's rate (the node's timer thread) with the time of the
    call; the run's clock starts at the first. `wait` blocks another thread until the run is
    done and returns (success, reason).
    """

    loop: PolicyLoop
    assembler: ObservationAssembler
    timeout_s: float
    judge: bool = True
    start_s: float | None = None  # the first step's time
    # How long observations may stay stale before the run ends (steps are skipped until then):
    # by default the envelope monitor's joint_state_timeout_s, so a scheduling hiccup on a
    # loaded computer skips steps instead of ending a trial the monitor would let go on.
    stale_abort_s: float = 0.5
    # A box goal is judged by a box pose of a box at rest, received after the timeout: the
    # tracker may have lost the box while the hand held or hid it, its last pose may be from
    # before the box came to rest, and the box may keep sliding after the policy's last
    # motion. The run ends on the first pose received since the timeout that is within
    # judge_settle_m (x-y) of the tracker's previous pose. Until one comes, at most judge_wait_s,
    # the policy keeps being stepped and its targets sent (the box pose's age no longer
    # stops the run); then the last pose judges, why said in the reason. (observation_model's
    # rest_step_m, 4 mm per axis, picks poses of a box at rest too, from a whole bag, to
    # estimate the tracker's noise: a looser bound over many pairs, not a trial's end.)
    judge_wait_s: float = 5.0
    judge_settle_m: float = 0.003
    judging_since: float | None = None
    box_poses: tuple = ()  # the last two box entries (x, y, receive time) seen by step(), oldest first
    stale_skips: int = 0
    stale_since: float | None = None
    outcome: tuple[bool, str] = (False, "")
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.loop.reset()

    def step(self, now_s: float, fault: str = "") -> list[float] | None:
        """The targets to send this period (None: nothing); `fault`: the monitor's latched fault ('' if none)."""
        if self.done.is_set():
            return None
        self.start_s = now_s if self.start_s is None else self.start_s
        self.note_box_pose()
        try:
            action = self.loop.step(self.assembler.assemble(now_s, box_age_checked=self.judging_since is None))
        except StaleObservation as error:
            # A late joint state skips this step (the policy is not stepped, nothing is
            # sent); one that stays missing ends the run.
            self.stale_skips += 1
            self.stale_since = self.stale_since if self.stale_since is not None else now_s
            if now_s - self.stale_since > self.stale_abort_s:
                self.finish(False, f"stopped: {error}")
            return None
        except FloatingPointError as error:
            self.finish(False, f"stopped: {error}")
            return None
        self.stale_since = None
        elapsed = now_s - self.start_s
        if fault:
            self.finish(False, f"envelope {fault}")
        elif self.judge and goal_reached(self.loop.spec, self.assembler.positions()):
            self.finish(True, "goal reached")
        elif self.timeout_s > 0 and elapsed > self.timeout_s:
            if self.judge and self.loop.spec.goal_box_xy is not None:  # judged where the box ends
                self.judge_box(now_s)
            else:
                self.finish(False, f"timeout after {elapsed:.1f} s")
        return action

    def note_box_pose(self) -> None:
        entry = self.assembler.box_entry() if self.loop.spec.goal_box_xy is not None else None
        if entry is not None and (not self.box_poses or entry[2] != self.box_poses[-1][2]):
            self.box_poses = (*self.box_poses[-1:], entry)

    def judge_box(self, now_s: float) -> None:
        """Finish on the first pose of a box at rest received since the timeout, or after
        judge_wait_s on the last one."""
        self.judging_since = now_s if self.judging_since is None else self.judging_since
        entry = self.box_poses[-1] if self.box_poses else None
        fresh = entry is not None and entry[2] >= self.judging_since
        moved = (float(np.hypot(entry[0] - self.box_poses[0][0], entry[1] - self.box_poses[0][1]))
                 if len(self.box_poses) == 2 else None)
        if fresh and moved is not None and moved <= self.judge_settle_m:
            self.finish(*box_goal_outcome(self.loop.spec, entry[:2]))
        elif now_s - self.judging_since >= self.judge_wait_s:
            if entry is None:
                note = ""
            elif not fresh:
                note = (f"judged by a box pose {now_s - entry[2]:.1f} s old: none came within "
                        f"{self.judge_wait_s:.1f} s of the trial's end")
            else:
                note = (f"the box had not come to rest {self.judge_wait_s:.1f} s after the trial's end"
                        + ("" if moved is None else f": it moved {moved * 1000:.0f} mm between its last two poses"))
            self.finish(*box_goal_outcome(self.loop.spec, None if entry is None else entry[:2], note))

    def finish(self, success: bool, reason: str) -> None:
        self.outcome = (success, reason)
        self.done.set()

    def wait(self, stop: Callable[[], bool] = lambda: False) -> tuple[bool, str]:
        while not self.done.wait(0.1):
            if stop():
                self.finish(False, "stopped before the run ended")
        return self.outcome
