"""The safety envelope: limits, the checks a joint command must pass, and the latched state.

Pure Python (no rclpy): the envelope monitor node translates messages to these calls.
Every check returns a named `Violation` (fault code + a reason that says what was
violated, by how much and what to do) instead of a bare boolean.

What is checked, in order, for each command while armed:
  1. names: every name is a commandable joint, each once, one position per name;
  2. finite targets;
  3. a measured joint state exists (the reference of every later check) and the watchdog
     has not found joint states stale;
  4. joint position limits (URDF limits shrunk by a per-joint margin), see "Limits" below;
  5. velocity and acceleration of the commanded targets (per-step differences at the
     nominal command period, see "Command streams" below) and the lead of the target over
     the measured position; `reject` latches a fault, `rate_limit` clamps the step instead
     (ros2_control's joint limiter does the same);
  6. Cartesian: forward kinematics (pinocchio) of the checked links at points along the
     step from the measured to the commanded configuration: every point inside the
     workspace box (shrunk by a margin) and outside every keep-out box (grown by it), see
     "Cartesian margin" below.
Besides the commands: external force (from /wrench) and two watchdogs (stale command
stream, stale joint states).

Command streams. A stream is what a source sends from arming (or a fault reset) on; it
ends with disarming. Its commands are read as a sequence of steps at the nominal period
`command_period_s`, as a fixed-rate robot controller takes them: the step of a command is
its target minus the stream's last forwarded target (the first command's: minus the
measured position), whatever the time between their arrivals. So
  - arrival jitter, a sender that publishes late rows in a burst, and callbacks of this
    monitor that run late change when steps arrive, never their size or reference: a
    well-formed stream is not faulted when it resumes after a pause. (The robot does get a
    burst as a jump of its target; the lead check bounds how far ahead of the measured
    position a burst can carry it.) Referencing a resumed stream to the measured position
    instead, as this monitor once did after a gap longer than the command timeout, turned
    the tracking error (10-40 mrad at speed) into a one-step velocity of 2.5-10 rad/s and
    faulted well-formed streams whose callbacks had been held up;
  - a real jump is a large step from the last target, and faults (velocity, acceleration,
    lead), however long the pause before it. A step that the sender skipped or the
    transport lost reads as a double step: on the safe side;
  - a sender silent for longer than `command_timeout_s` is a stalled stream: the command
    watchdog latches STALE_COMMAND and the robot holds. That is a fault by design (the
    source stalled or died mid-motion; an operator looks and resets). A source that
    stops on purpose disarms first. The watchdog runs on the monitor's control tick and
    judges the silence as of the time the tick was due (`tick(now_s)`): the monitor
    handles its inputs in arrival order, so by then every command that arrived before that
    time has been handled, and a tick that runs late (on a loaded 2-core host the
    monitor's ticks ran up to 1.2 s late at load 16-21: bench/envelope_callbacks.py) does
    not read the commands still queued behind it as silence. A silence that has ended by
    the time a late tick runs is not a fault. Whether joint states are stale is that same
    watchdog's verdict (`tick`), which commands, arming and resets go by.
  - a monitor held up itself (a control tick more than half the shortest watchdog timeout
    after the previous one: the process was stopped or starved) does not judge silence at
    that first tick (`HoldUpGuard`): it can run before the commands queued during the
    hold-up (the executor's threads wake in no fixed order) and read them as silence.
    Without it, a monitor stopped for 0.5 s with 0.2 s watchdogs faulted a well-formed
    stream on resumption (test_envelope_monitor.py, `..._stalls_longer_than_its_watchdogs_...`).
    The next tick judges whatever came before (two ticks never skip in a row), so a dead
    sender is caught at most one tick later than before. (Counting the hold-up off the
    watchdog's clock delayed that by the whole hold-up, 337 ms past a 500 ms watchdog; a
    grace period after every tick more than two periods late silenced the watchdogs of a
    monitor running late all the time: both seen in fresh-clone runs.) The
    time held up is counted and published in the diagnostics (`held_up_s`, `hold_ups`).

Limits. A target exactly at a position limit is inside it (within `LIMIT_ROUNDOFF`, so
that one computed onto the limit passes despite float round-off). A target beyond a limit
faults unless it is no farther beyond than the step's start (the stream's last target, or
the measured position for its first command): a joint measured a hair beyond a limit
(encoder noise at a stop, a gripper resting on its stop, a robot moved there by hand) can
be held there and moved back in, never farther out.

Cartesian margin. The checked regions are the workspace shrunk and the keep-out boxes grown
by `cartesian_margin_m`: commands keep the links a margin away from the true boundaries, and
the margin is what a link may be pushed into by contact. A link measured inside that band
(a hand pushing a box at mid-height, pressed 5-15 mm down by the contact under drawn
physics, seeds 1 and 4, with the floor 5 mm under its commanded path: a fresh-clone run
faulted so) may be held there and moved back out of it, never deeper into it than it was
measured; a link measured beyond the band (past the true boundary) is allowed nothing: every
step that keeps a sample outside the checked region faults, as before.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import yaml

from twinloop_twin.contract import CommandRejected, parse_joint_command
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.parameters import ParameterSet

# rad (m for the finger): float round-off allowed at a position limit.
LIMIT_ROUNDOFF = 1e-9


class Fault(enum.IntEnum):
    """Mirrors twinloop_interfaces/msg/EnvelopeStatus FAULT_* (a test keeps them equal)."""

    NONE = 0
    NON_FINITE_COMMAND = 1
    UNKNOWN_JOINT = 2
    POSITION_LIMIT = 3
    VELOCITY_LIMIT = 4
    ACCELERATION_LIMIT = 5
    WORKSPACE = 6
    KEEP_OUT = 7
    FORCE_LIMIT = 8
    STALE_COMMAND = 9
    STALE_JOINT_STATE = 10


class State(enum.IntEnum):
    """Mirrors EnvelopeStatus STATE_*."""

    DISARMED = 0
    ARMED = 1
    FAULT = 2


class EnvelopeConfigError(ValueError):
    """The envelope's limits are inconsistent; the message names the setting and the fix."""


@dataclass(frozen=True)
class Violation:
    fault: Fault
    reason: str
    joints: tuple[str, ...] = ()


@dataclass(frozen=True)
class Box:
    """Axis-aligned box in the world frame (m)."""

    name: str
    minimum: tuple[float, float, float]
    maximum: tuple[float, float, float]

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) for v in self.minimum + self.maximum):
            raise EnvelopeConfigError(f"box '{self.name}': corners must be finite, got {self.minimum}, {self.maximum}")
        if any(lo >= hi for lo, hi in zip(self.minimum, self.maximum)):
            raise EnvelopeConfigError(
                f"box '{self.name}': min {self.minimum} must be below max {self.maximum} on every axis")

    def grown(self, margin_m: float) -> "Box":
        return Box(self.name, tuple(v - margin_m for v in self.minimum), tuple(v + margin_m for v in self.maximum))

    def contains(self, points: np.ndarray) -> np.ndarray:
        """Boolean per row of an (n, 3) array."""
        return np.all((points >= self.minimum) & (points <= self.maximum), axis=1)

    @property
    def center(self) -> tuple[float, float, float]:
        return tuple((lo + hi) / 2 for lo, hi in zip(self.minimum, self.maximum))

    @property
    def size(self) -> tuple[float, float, float]:
        return tuple(hi - lo for lo, hi in zip(self.minimum, self.maximum))


def boxes_from_flat(values: Sequence[float], names: Sequence[str]) -> list[Box]:
    """[xmin, ymin, zmin, xmax, ymax, zmax] * n (a ROS parameter holds only flat arrays)."""
    values = list(values)
    if len(values) % 6 or len(values) // 6 != len(names):
        raise EnvelopeConfigError(
            f"keep_out_boxes has {len(values)} numbers for {len(names)} names: give 6 numbers "
            "(xmin, ymin, zmin, xmax, ymax, zmax) per name in keep_out_names")
    return [Box(name, tuple(values[6 * i:6 * i + 3]), tuple(values[6 * i + 3:6 * i + 6]))
            for i, name in enumerate(names)]


@dataclass(frozen=True)
class EnvelopeLimits:
    """Every limit of the envelope. Angles rad (m for the finger), times s, forces N."""

    joint_names: tuple[str, ...]  # commandable joints, in this order everywhere below
    lower: tuple[float, ...]  # position limits after the margin
    upper: tuple[float, ...]
    velocity: tuple[float, ...]  # rad/s (m/s)
    acceleration: tuple[float, ...]  # rad/s^2 (m/s^2)
    max_target_lead: tuple[float, ...]  # |target - measured| bound, rad (m)
    command_period_s: float  # nominal period of the command stream
    limit_mode: str  # "reject" | "rate_limit"
    workspace: Box
    keep_out: tuple[Box, ...]
    cartesian_margin_m: float
    checked_links: tuple[str, ...]
    sample_spacing_rad: float  # largest joint step between two FK samples along a step
    max_force_n: float  # <= 0: no force limit
    command_timeout_s: float
    joint_state_timeout_s: float

    def __post_init__(self) -> None:
        n = len(self.joint_names)
        for name in ("lower", "upper", "velocity", "acceleration", "max_target_lead"):
            if len(getattr(self, name)) != n:
                raise EnvelopeConfigError(f"{name} has {len(getattr(self, name))} values for {n} joints")
        narrow = [j for j, lo, hi in zip(self.joint_names, self.lower, self.upper) if lo > hi]
        if narrow:
            raise EnvelopeConfigError(
                f"position margins leave no range for {narrow}: reduce position_margins for them")
        if self.limit_mode not in ("reject", "rate_limit"):
            raise EnvelopeConfigError(f"limit_mode is {self.limit_mode!r}: use 'reject' or 'rate_limit'")
        for name in ("command_period_s", "command_timeout_s", "joint_state_timeout_s", "sample_spacing_rad"):
            if not getattr(self, name) > 0:
                raise EnvelopeConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if any(v <= 0 for v in self.velocity + self.acceleration + self.max_target_lead):
            raise EnvelopeConfigError("velocity, acceleration and target-lead limits must all be > 0")
        if self.cartesian_margin_m < 0:
            raise EnvelopeConfigError(f"cartesian_margin_m must be >= 0, got {self.cartesian_margin_m}")


def build_limits(kinematics: UrdfTransforms, *, joint_names: Sequence[str], position_margins: Sequence[float],
                 velocity_scale: float, acceleration_limits: Sequence[float], max_target_lead: Sequence[float],
                 **rest) -> EnvelopeLimits:
    """Limits from the robot's URDF (positions, velocities) and the configuration."""
    model = kinematics.model
    n = len(joint_names)
    for name, values in (("position_margins", position_margins), ("acceleration_limits", acceleration_limits),
                         ("max_target_lead", max_target_lead)):
        if len(values) != n:
            raise EnvelopeConfigError(f"{name} has {len(values)} values but joint_names has {n}: one per joint")
    if not 0 < velocity_scale <= 1:
        raise EnvelopeConfigError(f"velocity_scale must be in (0, 1], got {velocity_scale}")
    lower, upper, velocity = [], [], []
    for joint, margin in zip(joint_names, position_margins):
        if not model.existJointName(joint):
            raise EnvelopeConfigError(f"joint '{joint}' of joint_names is not in the robot's URDF")
        j = model.joints[model.getJointId(joint)]
        lower.append(float(model.lowerPositionLimit[j.idx_q]) + margin)
        upper.append(float(model.upperPositionLimit[j.idx_q]) - margin)
        velocity.append(float(model.velocityLimit[j.idx_v]) * velocity_scale)
    links = rest.get("checked_links", ())
    unknown = [link for link in links if not model.existFrame(link)]
    if unknown:
        raise EnvelopeConfigError(f"checked_links {unknown} are not frames of the robot's URDF")
    return EnvelopeLimits(joint_names=tuple(joint_names), lower=tuple(lower), upper=tuple(upper),
                          velocity=tuple(velocity), acceleration=tuple(float(a) for a in acceleration_limits),
                          max_target_lead=tuple(float(v) for v in max_target_lead), **rest)


def tighten_from_twin(limits: EnvelopeLimits, parameters: ParameterSet, *, k_sigma: float,
                      max_cartesian_speed_m_s: float) -> EnvelopeLimits:
    """Widen the margins by what the twin does not know.

    The command delay is uncertain by sigma: for k_sigma * sigma longer than assumed the
    robot keeps moving at up to its velocity limit, so each joint margin grows by
    v_max * k * sigma and the Cartesian margin by max_cartesian_speed * k * sigma.
    """
    if "command.delay_s" not in parameters:
        raise EnvelopeConfigError("the twin has no 'command.delay_s' parameter to tighten the envelope with")
    extra_s = k_sigma * parameters["command.delay_s"].std
    widened = [v * extra_s for v in limits.velocity]
    return replace(limits,
                   lower=tuple(lo + w for lo, w in zip(limits.lower, widened)),
                   upper=tuple(hi - w for hi, w in zip(limits.upper, widened)),
                   cartesian_margin_m=limits.cartesian_margin_m + max_cartesian_speed_m_s * extra_s)


@dataclass
class _History:
    """The current stream's last forwarded targets (the reference of its next step) and
    their step velocity (None until the stream's second command)."""

    targets: np.ndarray | None = None
    velocity: np.ndarray | None = None


@dataclass
class Decision:
    """Outcome of one command: `forward` (positions in `names` order) or a violation."""

    names: list[str]
    forward: list[float] | None = None
    violation: Violation | None = None
    limited: bool = False  # rate_limit mode changed the targets
    rejected_quietly: str = ""  # refused without a fault (disarmed / faulted)


class HoldUpGuard:
    """Tells the watchdogs whether a control tick may judge silence.

    `tick(now)` is called at the start of each control tick with the host's monotonic time.
    A tick that comes more than `hold_up_s` after the previous one (the monitor itself did
    not run: its process was stopped or starved; half the shortest watchdog timeout, at
    least two periods) does not judge silence: on resumption it can run before the events
    that queued during the hold-up (the executor's threads wake in no fixed order), and it
    would read them as silence. The tick after it judges, whatever came before: two ticks
    in a row never skip, so a monitor that runs late all the time still judges every other
    tick (see "Command streams" above).
    """

    def __init__(self, period_s: float, shortest_timeout_s: float) -> None:
        self.period_s = period_s
        self.hold_up_s = max(2.0 * period_s, 0.5 * shortest_timeout_s)
        self.held_up_s = 0.0  # total time the monitor was held up
        self.hold_ups = 0
        self._last_tick: float | None = None
        self._skipped_last = False

    def tick(self, now: float) -> bool:
        """True when the tick starting at host time `now` may judge silence."""
        held_up = self._last_tick is not None and now - self._last_tick > self.hold_up_s
        if held_up:
            self.held_up_s += now - self._last_tick - self.period_s
            self.hold_ups += 1
        self._last_tick = now
        skip = held_up and not self._skipped_last
        self._skipped_last = skip
        return not skip


@dataclass
class EnvelopeMonitor:
    """The envelope's state machine: DISARMED -> ARMED -> FAULT (latched) -> reset -> ARMED."""

    limits: EnvelopeLimits
    kinematics: UrdfTransforms
    state: State = State.DISARMED
    fault: Violation | None = None
    hold_positions: dict[str, float] = field(default_factory=dict)
    commands_forwarded: int = 0
    commands_rejected: int = 0
    commands_limited: int = 0
    _measured: dict[str, float] = field(default_factory=dict)
    _measured_time_s: float = -math.inf
    _joint_states_stale: bool = True  # the watchdog's verdict, at its last tick
    _force_n: float = 0.0
    _history: _History = field(default_factory=_History)
    _last_command_s: float | None = None

    # ---------------------------------------------------------------- inputs
    def on_joint_state(self, names: Sequence[str], positions: Sequence[float],
                       velocities: Sequence[float], now_s: float) -> None:
        self._measured.update(zip(names, positions))
        self._measured_time_s = now_s
        self._joint_states_stale = False

    def on_force(self, force_xyz: Sequence[float], now_s: float) -> Violation | None:
        self._force_n = float(np.linalg.norm(force_xyz))
        if self.state is State.ARMED and self.limits.max_force_n > 0:
            if not math.isfinite(self._force_n) or self._force_n > self.limits.max_force_n:
                return self._latch(Violation(
                    Fault.FORCE_LIMIT,
                    f"external force {self._force_n:.1f} N exceeds the limit {self.limits.max_force_n:.1f} N: "
                    "check the cell for a collision, then reset the fault"))
        return None

    def last_command_age_s(self, now_s: float) -> float | None:
        """Seconds since the last command was taken (None: none since arming)."""
        return None if self._last_command_s is None else now_s - self._last_command_s

    def tick(self, now_s: float) -> Violation | None:
        """Watchdogs; call at the monitor's control rate with the time the tick was due
        (every input that arrived before it has been handed in by then)."""
        age = now_s - self._measured_time_s
        self._joint_states_stale = age > self.limits.joint_state_timeout_s
        if self.state is not State.ARMED:
            return None
        if self._joint_states_stale:
            return self._latch(Violation(
                Fault.STALE_JOINT_STATE,
                f"no joint state for {age * 1e3:.0f} ms (limit {self.limits.joint_state_timeout_s * 1e3:.0f} ms): "
                "check the robot driver and /joint_states, then reset the fault"))
        # The command watchdog starts with the first command after arming: arming alone
        # must not fault before the policy has begun.
        if self._last_command_s is not None:
            age = now_s - self._last_command_s
            if age > self.limits.command_timeout_s:
                return self._latch(Violation(
                    Fault.STALE_COMMAND,
                    f"no command for {age * 1e3:.0f} ms (limit {self.limits.command_timeout_s * 1e3:.0f} ms): "
                    "the command source stopped or stalled; disarm before stopping a policy, then reset"))
        return None

    # ---------------------------------------------------------------- commands
    def check_command(self, names: Sequence[str], positions: Sequence[float], now_s: float) -> Decision:
        """`now_s`: monotonic time the command is handled (the command watchdog counts from it)."""
        names = list(names)
        if self.state is not State.ARMED:
            self.commands_rejected += 1
            return Decision(names, rejected_quietly=f"monitor is {self.state.name.lower()}")
        violation, decision = self._evaluate(names, list(positions))
        if violation is not None:
            self.commands_rejected += 1
            self._latch(violation)
            return Decision(names, violation=violation)
        self._last_command_s = now_s
        self.commands_forwarded += 1
        self.commands_limited += decision.limited
        return decision

    def _evaluate(self, names: list[str], positions: list[float]):
        lim = self.limits
        try:
            targets = parse_joint_command(names, positions, lim.joint_names)
        except CommandRejected as error:
            fault = Fault.NON_FINITE_COMMAND if error.code == "NON_FINITE_COMMAND" else Fault.UNKNOWN_JOINT
            return Violation(fault, f"{error.code}: {error}"), None
        if not self._measured or self._joint_states_stale:
            return Violation(Fault.STALE_JOINT_STATE,
                             "command arrived without a fresh joint state to check it against: "
                             "check /joint_states, then reset the fault"), None
        index = [lim.joint_names.index(n) for n in names]
        measured_full = np.array([self._measured.get(j, 0.0) for j in lim.joint_names])
        # Joints the command does not name keep their previous target.
        reference = self._reference(measured_full)
        target = reference.copy()
        target[index] = [targets[n] for n in names]

        # A target may sit beyond a limit only where the step starts beyond it, and no farther.
        lower = np.minimum(np.array(lim.lower), reference) - LIMIT_ROUNDOFF
        upper = np.maximum(np.array(lim.upper), reference) + LIMIT_ROUNDOFF
        out = [i for i in index if target[i] < lower[i] or target[i] > upper[i]]
        if out:
            # Micrometre digits: a target a hair beyond a limit must not print as on it.
            detail = ", ".join(f"{lim.joint_names[i]}={target[i]:.6f} outside [{lim.lower[i]:.6f}, "
                               f"{lim.upper[i]:.6f}]" for i in out)
            return Violation(Fault.POSITION_LIMIT, f"target beyond the position limits with margin: {detail}; "
                             "command targets inside them", tuple(lim.joint_names[i] for i in out)), None

        target, limited, violation, velocity = self._rate_check(target, reference, measured_full, index)
        if violation is not None:
            return violation, None
        violation = self._cartesian_check(measured_full, target)
        if violation is not None:
            return violation, None
        self._history = _History(target.copy(), velocity)
        return None, Decision(names, forward=[float(target[i]) for i in index], limited=limited)

    def _reference(self, measured: np.ndarray) -> np.ndarray:
        """Where the next step starts: the stream's last forwarded target, whatever the time
        since it (see "Command streams" in the module docstring); the measured position for
        a stream's first command."""
        if self._history.targets is not None:
            return self._history.targets.copy()
        return measured.copy()

    def _rate_check(self, target, reference, measured, index):
        lim = self.limits
        period = lim.command_period_s
        vmax, amax = np.array(lim.velocity), np.array(lim.acceleration)
        velocity = (target - reference) / period
        from_command = self._history.targets is not None
        previous_velocity = self._history.velocity
        # Acceleration is a difference of two steps from the third command of a stream on:
        # the first step is referenced to the measured position, whose noise over one period
        # would read as velocity, so it is bounded by the velocity and lead checks alone.
        acceleration = ((velocity - previous_velocity) / period if previous_velocity is not None
                        else np.zeros_like(velocity))
        limited = False
        if lim.limit_mode == "rate_limit":
            low, high = -vmax, vmax
            if previous_velocity is not None:
                low = np.maximum(low, previous_velocity - amax * period)
                high = np.minimum(high, previous_velocity + amax * period)
            clamped_velocity = np.clip(velocity, low, np.maximum(low, high))
            if not np.allclose(clamped_velocity, velocity, rtol=0.0, atol=1e-12):
                limited = True
                target = reference + clamped_velocity * period
                velocity = clamped_velocity
        else:
            fast = [i for i in index if abs(velocity[i]) > vmax[i]]
            if fast:
                detail = ", ".join(f"{lim.joint_names[i]} {velocity[i]:+.3f} (limit {vmax[i]:.3f})" for i in fast)
                return target, False, Violation(
                    Fault.VELOCITY_LIMIT, f"commanded step implies a velocity over the limit: {detail} per s "
                    f"(one command is one {period * 1e3:.0f} ms step from the last target); "
                    "smooth the command or raise velocity_scale", tuple(lim.joint_names[i] for i in fast)), None
            jerky = [i for i in index if abs(acceleration[i]) > amax[i]]
            if jerky:
                detail = ", ".join(f"{lim.joint_names[i]} {acceleration[i]:+.2f} (limit {amax[i]:.2f})"
                                   for i in jerky)
                return target, False, Violation(
                    Fault.ACCELERATION_LIMIT, f"commanded steps imply an acceleration over the limit: {detail} "
                    "per s^2; smooth the command", tuple(lim.joint_names[i] for i in jerky)), None
        next_velocity = velocity if from_command else None
        lead = np.abs(target - measured)
        far = [i for i in index if lead[i] > lim.max_target_lead[i]]
        if far:
            detail = ", ".join(f"{lim.joint_names[i]} {lead[i]:.3f} (limit {lim.max_target_lead[i]:.3f})"
                               for i in far)
            return target, False, Violation(
                Fault.VELOCITY_LIMIT, f"target runs ahead of the measured position: {detail}; "
                "the robot would jump to it", tuple(lim.joint_names[i] for i in far)), None
        return target, limited, None, next_velocity

    def _cartesian_check(self, start: np.ndarray, end: np.ndarray) -> Violation | None:
        lim = self.limits
        if not lim.checked_links:
            return None
        steps = max(1, int(math.ceil(np.max(np.abs(end - start)) / lim.sample_spacing_rad)))
        regions = cartesian_regions(lim)
        allowed = None
        for k in range(1, steps + 1):
            points = self.link_positions(start + (end - start) * (k / steps))
            violation = cartesian_violation(lim, points, regions, allowed=allowed)
            if violation is not None and allowed is None:
                # Only now (the common path costs no extra kinematics): how far each link is
                # measured into the margin band, which it may stay in. One measured beyond the
                # band (past the true boundary) is allowed nothing.
                allowed = [np.where(depth <= lim.cartesian_margin_m + LIMIT_ROUNDOFF, depth, 0.0)
                           for depth in cartesian_depths(regions, self.link_positions(start))]
                violation = cartesian_violation(lim, points, regions, allowed=allowed)
            if violation is not None:
                return violation
        return None

    def link_positions(self, q: np.ndarray) -> np.ndarray:
        """World positions (n_links, 3) of the checked links at joint positions q (joint_names order)."""
        positions = dict(zip(self.limits.joint_names, q.tolist()))
        if "panda_finger_joint1" in positions:
            positions.setdefault("panda_finger_joint2", positions["panda_finger_joint1"])  # mimic
        return np.array([self.kinematics.world_T_link(link, positions)[:3, 3] for link in self.limits.checked_links])

    # ---------------------------------------------------------------- state
    def _latch(self, violation: Violation) -> Violation:
        if self.state is State.FAULT:
            return self.fault  # the first fault stays the reason
        self.state = State.FAULT
        self.fault = violation
        self.hold_positions = self.current_positions()
        return violation

    def current_positions(self) -> dict[str, float]:
        return {j: self._measured[j] for j in self.limits.joint_names if j in self._measured}

    def arm(self) -> str:
        """Returns '' on success, else why arming was refused."""
        if self.state is State.FAULT:
            return f"a fault is latched ({self.fault.fault.name}): reset it first"
        if self._joint_states_stale:
            return "no fresh joint state: cannot arm without knowing where the robot is"
        self.state = State.ARMED
        self._forget_commands()
        return ""

    def disarm(self) -> None:
        if self.state is State.ARMED:
            self.state = State.DISARMED
            self.hold_positions = self.current_positions()
        self._forget_commands()

    def reset_fault(self) -> tuple[Fault, str]:
        """Clear the latched fault and re-arm. Returns (cleared fault, refusal or '')."""
        if self.state is not State.FAULT:
            return Fault.NONE, ""
        cleared = self.fault.fault
        if self._joint_states_stale:
            return cleared, "joint states are still stale: fix them before resetting"
        if self.limits.max_force_n > 0 and self._force_n > self.limits.max_force_n:
            return cleared, f"external force is still {self._force_n:.1f} N: clear the contact before resetting"
        self.state, self.fault = State.ARMED, None
        self._forget_commands()
        return cleared, ""

    def _forget_commands(self) -> None:
        self._history = _History()
        self._last_command_s = None


def cartesian_regions(limits: EnvelopeLimits) -> tuple[Box, tuple[Box, ...]]:
    """The workspace shrunk and the keep-out boxes grown by the Cartesian margin."""
    margin = limits.cartesian_margin_m
    return limits.workspace.grown(-margin), tuple(box.grown(margin) for box in limits.keep_out)


def cartesian_depths(regions: tuple[Box, tuple[Box, ...]], points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How far each of `points` (n, 3) lies outside the workspace (n,) and inside each
    keep-out box (n, n_boxes), in m; 0 where it does not. `regions`: cartesian_regions()."""
    workspace, keep_out = regions
    below, above = np.array(workspace.minimum) - points, points - np.array(workspace.maximum)
    outside = np.maximum(np.max(np.maximum(below, above), axis=1), 0.0)
    inside = np.zeros((len(points), len(keep_out)))
    for k, box in enumerate(keep_out):
        depth = np.min(np.minimum(points - np.array(box.minimum), np.array(box.maximum) - points), axis=1)
        inside[:, k] = np.maximum(depth, 0.0)
    return outside, inside


def cartesian_violation(limits: EnvelopeLimits, points: np.ndarray,
                        regions: tuple[Box, tuple[Box, ...]] | None = None,
                        allowed: tuple[np.ndarray, np.ndarray] | None = None) -> Violation | None:
    """The workspace and keep-out check of one pose: `points` (n_links, 3) are the checked
    links' world positions (EnvelopeMonitor.link_positions). The monitor runs it along every
    commanded step; a planner runs it on every state it considers. `regions`:
    cartesian_regions(limits), computed once by a caller that checks many poses. `allowed`:
    how far (m) each link may lie outside the workspace and inside each keep-out box, in
    cartesian_depths()'s shapes (none by default; see "Cartesian margin" above)."""
    workspace, keep_out = regions if regions is not None else cartesian_regions(limits)
    outside, inside = cartesian_depths((workspace, keep_out), points)
    if allowed is not None:
        outside = np.where(outside > allowed[0] + LIMIT_ROUNDOFF, outside, 0.0)
        inside = np.where(inside > allowed[1] + LIMIT_ROUNDOFF, inside, 0.0)
    if (outside > 0).any():
        link = limits.checked_links[int(np.argmax(outside > 0))]
        p = points[int(np.argmax(outside > 0))]
        return Violation(Fault.WORKSPACE,
                         f"{link} would leave the workspace box at ({p[0]:.3f}, {p[1]:.3f}, {p[2]:.3f}) m "
                         f"(box {workspace.minimum}..{workspace.maximum} after a "
                         f"{limits.cartesian_margin_m:.3f} m margin); command a path inside it")
    for k, box in enumerate(keep_out):
        entered = inside[:, k] > 0
        if entered.any():
            link = limits.checked_links[int(np.argmax(entered))]
            p = points[int(np.argmax(entered))]
            return Violation(Fault.KEEP_OUT,
                             f"{link} would enter keep-out box '{box.name}' at "
                             f"({p[0]:.3f}, {p[1]:.3f}, {p[2]:.3f}) m; command a path around it")
    return None


# The envelope monitor's parameters that make its limits (config/envelope.yaml).
LIMIT_PARAMETERS = ("joint_names", "position_margins", "velocity_scale", "acceleration_limits", "max_target_lead",
                    "command_period_s", "limit_mode", "workspace_min", "workspace_max", "keep_out_boxes",
                    "keep_out_names", "cartesian_margin_m", "checked_links", "sample_spacing_rad", "max_force_n",
                    "command_timeout_s", "joint_state_timeout_s")


def limits_from_parameters(kinematics: UrdfTransforms, p: Mapping) -> EnvelopeLimits:
    """The limits from the envelope monitor's parameters (LIMIT_PARAMETERS; the node's, or a
    parameter file's section read by load_envelope_limits)."""
    return build_limits(
        kinematics, joint_names=list(p["joint_names"]), position_margins=list(p["position_margins"]),
        velocity_scale=float(p["velocity_scale"]), acceleration_limits=list(p["acceleration_limits"]),
        max_target_lead=list(p["max_target_lead"]), command_period_s=float(p["command_period_s"]),
        limit_mode=p["limit_mode"],
        workspace=boxes_from_flat(list(p["workspace_min"]) + list(p["workspace_max"]), ["workspace"])[0],
        keep_out=tuple(boxes_from_flat(list(p["keep_out_boxes"]), list(p["keep_out_names"]))),
        cartesian_margin_m=float(p["cartesian_margin_m"]), checked_links=tuple(p["checked_links"]),
        sample_spacing_rad=float(p["sample_spacing_rad"]), max_force_n=float(p["max_force_n"]),
        command_timeout_s=float(p["command_timeout_s"]), joint_state_timeout_s=float(p["joint_state_timeout_s"]))


def load_envelope_limits(path: Path | str, kinematics: UrdfTransforms) -> EnvelopeLimits:
    """The limits an envelope monitor started with this parameter file (its
    `envelope_monitor` section) enforces. EnvelopeConfigError names what is missing or wrong."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise EnvelopeConfigError(f"cannot read the envelope parameters {path}: {error}") from error
    section = next((v.get("ros__parameters") for k, v in (raw or {}).items()
                    if str(k).endswith("envelope_monitor") and isinstance(v, dict)), None) \
        if isinstance(raw, dict) else None
    if not isinstance(section, dict):
        raise EnvelopeConfigError(f"{path}: no envelope_monitor section with ros__parameters "
                                  "(give the envelope monitor's parameter file, e.g. config/envelope.yaml)")
    missing = [k for k in LIMIT_PARAMETERS if k not in section]
    if missing:
        raise EnvelopeConfigError(f"{path}: the envelope_monitor section lacks {', '.join(missing)}")
    try:
        return limits_from_parameters(kinematics, section)
    except (TypeError, ValueError) as error:
        if isinstance(error, EnvelopeConfigError):
            raise
        raise EnvelopeConfigError(f"{path}: {error}") from error


def write_envelope_with_keep_out(source: Path | str, target: Path | str, name: str,
                                 corners: Sequence[float]) -> Path:
    """A copy of the envelope monitor's parameter file `source` with one more keep-out box
    (`corners`: xmin ymin zmin xmax ymax zmax, m, world) written to `target`; its path."""
    raw = yaml.safe_load(Path(source).read_text())
    section = raw["/**/envelope_monitor"]["ros__parameters"]
    section["keep_out_boxes"] = list(section["keep_out_boxes"]) + [float(v) for v in corners]
    section["keep_out_names"] = list(section["keep_out_names"]) + [name]
    target = Path(target)
    target.write_text(yaml.safe_dump(raw, sort_keys=False))
    return target


def limits_summary(limits: EnvelopeLimits) -> Mapping[str, str]:
    """Key values for diagnostics."""
    return {"limit_mode": limits.limit_mode, "command_period_s": f"{limits.command_period_s:.4f}",
            "cartesian_margin_m": f"{limits.cartesian_margin_m:.3f}",
            "keep_out_boxes": str(len(limits.keep_out)), "max_force_n": f"{limits.max_force_n:.1f}"}
