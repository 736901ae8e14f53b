"""Safe exciting trajectories for identification: joint multi-sines and box pushes.

Pure Python (no rclpy). The joint excitation is a band-limited multi-sine per joint
(distinct random frequencies and phases, amplitudes ~1/f so every component moves the
joint at a similar speed), faded in and out with a raised-cosine window so it starts and
ends at rest at the home pose. Every trajectory is checked against the joint range (with a
margin), a fraction of the URDF velocity limit, and the workspace (the hand stays above the
table, no contact anywhere) on the twin's own MuJoCo model before it is played; amplitudes
shrink until it passes.

Pushes are Cartesian paths of the closed hand (tool centre point at the box's mid-height,
pointing down) turned into joint trajectories by damped least-squares IK on the same model.
"""
from __future__ import annotations

import math
import numbers
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import mujoco
import numpy as np
import yaml

from twinloop_planning.scene import descends
from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS, COMMANDED_JOINTS

TCP_BODY = "panda_hand_tcp"
GRIPPER_JOINT = "panda_finger_joint1"
ROBOT_ROOT = "panda_link0"
DEFAULT_ACCELERATION_LIMITS = {"panda_joint1": 7.5, "panda_joint2": 3.75, "panda_joint3": 5.0, "panda_joint4": 6.25,
                               "panda_joint5": 7.5, "panda_joint6": 10.0, "panda_joint7": 10.0,
                               "panda_finger_joint1": 1.0}
# rad (m gripper): the player holds its schedule while the measured position lags its last
# target by more than this (60 % of the envelope monitor's default max_target_lead).
# The gripper's is above a lift's squeeze (its fingers stay that far short of their target
# while they hold the box) and below the monitor's max_target_lead (0.04 m).
DEFAULT_PAUSE_LEAD = {**{f"panda_joint{i}": 0.15 for i in range(1, 8)}, "panda_finger_joint1": 0.032}


class ExcitationError(ValueError):
    """An excitation that cannot be made safe, or a bad excitation file; says what to change."""


@dataclass(frozen=True)
class JointExcitationConfig:
    duration_s: float = 30.0  # s, including the fade in and out
    ramp_s: float = 1.5  # s, raised-cosine fade in and out
    band_hz: tuple[float, float] = (0.1, 1.0)  # Hz, frequency band of the multi-sine
    components: int = 5  # sines per joint
    amplitude: Mapping[str, float] = field(default_factory=dict)  # peak deviation from home, rad (m)
    velocity_fraction: float = 0.5  # of the URDF velocity limit
    # rad/s^2 (m/s^2 finger): per-step accelerations of every trajectory stay below these.
    # Defaults: the envelope monitor's (half of Franka's published limits), which rejects more.
    acceleration_limits: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_ACCELERATION_LIMITS))
    position_margin_rad: float = 0.15  # rad, kept from each joint limit
    min_tcp_height_m: float = 0.15  # m above the table top, anywhere on the path
    command_rate_hz: float = 250.0  # Hz, rate the commands are published at
    seed: int = 0
    # rad (m finger): while the robot lags the last sent target by more than this, the
    # player holds the rest of the schedule (at most max_pause_s at a time): a loaded host
    # or a slow plant then pauses the motion instead of letting the target run ahead of the
    # robot into the monitor's lead check. Keep below config/envelope.yaml's max_target_lead.
    pause_lead: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_PAUSE_LEAD))
    max_pause_s: float = 0.2  # s, well below the monitor's command_timeout_s (it faults a silent stream)


@dataclass(frozen=True)
class PushConfig:
    direction_deg: float  # push direction in the world xy plane (0: +x)
    offset_m: float = 0.0  # lateral offset of the contact point from the box centre
    distance_m: float = 0.06  # m the hand travels past first contact
    speed_m_s: float = 0.25  # m/s, hand speed while pushing


@dataclass(frozen=True)
class LiftConfig:
    """Grasp the box from above, lift it, hold it, set it back down where it was. The held
    box's weight loads the arm (its mass alone); pushes feel mass times friction."""
    height_m: float = 0.05  # m the hand rises with the box
    hold_s: float = 1.5  # s held at the top
    squeeze_m: float = 0.03  # m each finger is commanded past the box's face (grip force = finger gain x this)


@dataclass(frozen=True)
class ExcitationConfig:
    joints: JointExcitationConfig
    pushes: tuple[PushConfig, ...]
    lifts: tuple[LiftConfig, ...] = ()


@dataclass
class JointTrajectory:
    """Position targets of the commanded joints at the command rate."""

    t: np.ndarray  # (N,) s from the start
    joints: tuple[str, ...]  # COMMANDED_JOINTS
    positions: np.ndarray  # (N, len(joints))
    slowed: float = 1.0  # > 1: a push ran this many times slower than configured (joint limits)

    @property
    def duration_s(self) -> float:
        return float(self.t[-1]) if len(self.t) else 0.0

    def then(self, other: "JointTrajectory") -> "JointTrajectory":
        dt = (self.t[1] - self.t[0]) if len(self.t) > 1 else 0.0
        return JointTrajectory(np.concatenate([self.t, other.t + self.t[-1] + dt]), self.joints,
                               np.vstack([self.positions, other.positions]))


def load_excitation_config(path: Path | str) -> ExcitationConfig:
    """config/excitation.yaml: `joints:` (JointExcitationConfig keys), `pushes:` (a list) and
    optionally `lifts:` (a list of LiftConfig keys).

    Every value is checked (type, finite, range) and every key known; ExcitationError names
    the first one that is not, with what is allowed."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as error:
        why = " ".join(str(error).split())
        raise ExcitationError(f"{path}: cannot read the excitation file ({why})") from error
    if not isinstance(raw, dict) or not {"joints", "pushes"} <= set(raw) <= {"joints", "pushes", "lifts"}:
        got = sorted(map(str, raw)) if isinstance(raw, dict) else type(raw).__name__
        raise ExcitationError(f"{path}: expected the keys 'joints', 'pushes' and optionally 'lifts', got {got}")
    if not isinstance(raw["joints"], dict):
        raise ExcitationError(f"{path}: 'joints' must be a mapping of JointExcitationConfig keys, "
                              f"got {raw['joints']!r}")
    known = set(JointExcitationConfig.__dataclass_fields__)
    unknown = set(map(str, raw["joints"])) - known
    if unknown:
        raise ExcitationError(f"{path}: unknown keys {sorted(unknown)} under 'joints'; known: {sorted(known)}")
    joints = dict(raw["joints"])
    for key in ("amplitude", "acceleration_limits", "pause_lead"):
        if key in joints and not isinstance(joints[key], dict):
            raise ExcitationError(f"{path}: joints.{key} must map joint names to numbers, got {joints[key]!r}")
        bad = [j for j in joints.get(key, {}) if j not in COMMANDED_JOINTS]
        if bad:
            raise ExcitationError(f"{path}: {key} names {bad}, which are not commanded joints "
                                  f"{list(COMMANDED_JOINTS)}")
    if isinstance(joints.get("band_hz"), list):
        joints["band_hz"] = tuple(joints["band_hz"])
    if "acceleration_limits" in joints:  # a partial list keeps the defaults of the others
        joints["acceleration_limits"] = {**DEFAULT_ACCELERATION_LIMITS, **joints["acceleration_limits"]}
    if "pause_lead" in joints:
        joints["pause_lead"] = {**DEFAULT_PAUSE_LEAD, **joints["pause_lead"]}
    if raw["pushes"] is not None and not isinstance(raw["pushes"], list):
        raise ExcitationError(f"{path}: 'pushes' must be a list of pushes (or empty), got {raw['pushes']!r}")
    push_keys = set(PushConfig.__dataclass_fields__)
    pushes = []
    for i, push in enumerate(raw["pushes"] or []):
        if not isinstance(push, dict) or not set(map(str, push)) <= push_keys or "direction_deg" not in push:
            raise ExcitationError(f"{path}: push {i} must be a mapping with direction_deg and optionally "
                                  f"offset_m, distance_m, speed_m_s; got {push!r}")
        pushes.append(PushConfig(**push))
    if raw.get("lifts") is not None and not isinstance(raw["lifts"], list):
        raise ExcitationError(f"{path}: 'lifts' must be a list of lifts (or empty), got {raw['lifts']!r}")
    lift_keys = set(LiftConfig.__dataclass_fields__)
    lifts = []
    for i, lift in enumerate(raw.get("lifts") or []):
        if not isinstance(lift, dict) or not set(map(str, lift)) <= lift_keys:
            raise ExcitationError(f"{path}: lift {i} must be a mapping of {sorted(lift_keys)} (all optional); "
                                  f"got {lift!r}")
        lifts.append(LiftConfig(**lift))
    config = ExcitationConfig(JointExcitationConfig(**joints), tuple(pushes), tuple(lifts))
    _validate(config, path)
    return config


def check_joint_config(config: JointExcitationConfig, source: object = "joint excitation") -> None:
    """Raise ExcitationError naming the first value of `config` that is of the wrong type,
    not finite, or out of range (a NaN amplitude would silently leave its joint still)."""
    def number(name: str, value, *, low: float | None = None, high: float | None = None,
               strict_low: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ExcitationError(f"{source}: {name} must be a finite number, got {value!r}")
        if low is not None and (value <= low if strict_low else value < low) or high is not None and value > high:
            bounds = f"{'>' if strict_low else '>='} {low}" if low is not None else ""
            bounds += (" and " if bounds and high is not None else "") + (f"<= {high}" if high is not None else "")
            raise ExcitationError(f"{source}: {name} must be {bounds}, got {value!r}")
        return float(value)

    number("duration_s", config.duration_s, low=0.0)
    number("ramp_s", config.ramp_s, low=0.0)
    if not isinstance(config.band_hz, (tuple, list)) or len(config.band_hz) != 2:
        raise ExcitationError(f"{source}: band_hz must be [low, high] in Hz, got {config.band_hz!r}")
    for value in config.band_hz:
        number("band_hz", value, low=0.0)
    for name in ("components", "seed"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or name == "components" and value < 1:
            raise ExcitationError(f"{source}: {name} must be a whole number{' >= 1' if name == 'components' else ''}"
                                  f", got {value!r}")
    for joint, value in dict(config.amplitude).items():
        number(f"amplitude of {joint}", value, low=0.0, strict_low=False)
    for joint, value in dict(config.acceleration_limits).items():
        number(f"acceleration_limits of {joint}", value, low=0.0)
    for joint, value in dict(config.pause_lead).items():
        number(f"pause_lead of {joint}", value, low=0.0)
    number("max_pause_s", config.max_pause_s, low=0.0, strict_low=False)
    number("velocity_fraction", config.velocity_fraction, low=0.0, high=1.0)
    number("position_margin_rad", config.position_margin_rad, low=0.0, strict_low=False)
    number("min_tcp_height_m", config.min_tcp_height_m)
    number("command_rate_hz", config.command_rate_hz, low=0.0)
    if config.duration_s <= 2 * config.ramp_s:
        raise ExcitationError(f"{source}: duration_s ({config.duration_s}) must exceed twice ramp_s "
                              f"({config.ramp_s})")
    if not config.band_hz[0] < config.band_hz[1]:
        raise ExcitationError(f"{source}: band_hz must be [low, high] with 0 < low < high, got {config.band_hz}")


def _check_finite(config: PushConfig | LiftConfig, what: str) -> None:
    """ExcitationError naming the first field of a push or lift that is not a finite number."""
    for name in config.__dataclass_fields__:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ExcitationError(f"{what}: {name} must be a finite number, got {value!r}")


def _validate(config: ExcitationConfig, source) -> None:
    check_joint_config(config.joints, source)
    for i, push in enumerate(config.pushes):
        _check_finite(push, f"{source}: push {i}")
        if push.distance_m <= 0 or push.speed_m_s <= 0:
            raise ExcitationError(f"{source}: push {i} needs distance_m > 0 and speed_m_s > 0, got {push}")
    lead = config.joints.pause_lead.get(GRIPPER_JOINT, math.inf)
    for i, lift in enumerate(config.lifts):
        _check_finite(lift, f"{source}: lift {i}")
        if lift.height_m <= 0 or lift.hold_s < 0 or lift.squeeze_m <= 0:
            raise ExcitationError(f"{source}: lift {i} needs height_m > 0, hold_s >= 0 and squeeze_m > 0, got {lift}")
        if lift.squeeze_m >= lead:
            raise ExcitationError(f"{source}: lift {i}: squeeze_m {lift.squeeze_m} must stay below the gripper's "
                                  f"pause_lead ({lead} m): the player would hold the motion while the fingers "
                                  "squeeze the box")


def velocity_limits(urdf_xml: str) -> dict[str, float]:
    """URDF <limit velocity> of every joint that has one (rad/s or m/s)."""
    limits = {}
    for joint in ET.fromstring(urdf_xml).iter("joint"):
        limit = joint.find("limit")
        if limit is not None and limit.get("velocity"):
            limits[joint.get("name")] = float(limit.get("velocity"))
    return limits


class WorkspaceChecker:
    """Forward kinematics and contacts on the twin's MuJoCo model (a private copy of the data)."""

    def __init__(self, model: mujoco.MjModel, table_height_m: float) -> None:
        self.model = model
        self.data = mujoco.MjData(model)
        self.table_height_m = table_height_m
        self._qpos = model.jnt_qposadr[[model.joint(j).id for j in ALL_JOINTS]]
        self._tcp = model.body(TCP_BODY).id
        root = model.body(ROBOT_ROOT).id
        self._robot_bodies = {b for b in range(model.nbody) if descends(model, b, root)}

    def set(self, positions: Mapping[str, float]) -> None:
        for name, value in positions.items():
            self.data.qpos[self._qpos[ALL_JOINTS.index(name)]] = value
        if GRIPPER_JOINT in positions:  # finger 2 mimics finger 1
            self.data.qpos[self._qpos[ALL_JOINTS.index("panda_finger_joint2")]] = positions[GRIPPER_JOINT]
        mujoco.mj_forward(self.model, self.data)

    def tcp_pose(self) -> tuple[np.ndarray, np.ndarray]:
        return self.data.xpos[self._tcp].copy(), self.data.xmat[self._tcp].reshape(3, 3).copy()

    def robot_contacts(self, *, allow_box: bool = False) -> list[tuple[str, str]]:
        out = []
        for contact in self.data.contact[:self.data.ncon]:
            bodies = (self.model.geom_bodyid[contact.geom1], self.model.geom_bodyid[contact.geom2])
            names = tuple(self.model.body(b).name for b in bodies)
            if not any(b in self._robot_bodies for b in bodies):
                continue
            if allow_box and "box" in names:
                continue
            out.append(names)
        return out

    def violations(self, positions: Mapping[str, float]) -> list[str]:
        self.set(positions)
        problems = []
        height = self.tcp_pose()[0][2] - self.table_height_m
        if height < 0:
            problems.append(f"hand {height * 100:.1f} cm below the table top")
        contacts = self.robot_contacts()
        if contacts:
            problems.append(f"contact {contacts[0][0]}-{contacts[0][1]}")
        return problems


def joint_excitation(config: JointExcitationConfig, home: Mapping[str, float], model: mujoco.MjModel,
                     urdf_xml: str, table_height_m: float, *, excite: tuple[str, ...] | None = None) -> JointTrajectory:
    """A multi-sine excitation of the commanded joints (all, or those in `excite`) around `home`.

    Raises ExcitationError for a config value out of range (check_joint_config) and when
    no amplitude scale passes the safety checks.
    """
    check_joint_config(config)
    rng = np.random.default_rng(config.seed)
    dt = 1.0 / config.command_rate_hz
    t = np.arange(0.0, config.duration_s + dt / 2, dt)
    window = np.ones_like(t)
    ramp = t < config.ramp_s
    window[ramp] = 0.5 * (1 - np.cos(np.pi * t[ramp] / config.ramp_s))
    tail = t > config.duration_s - config.ramp_s
    window[tail] = 0.5 * (1 - np.cos(np.pi * (config.duration_s - t[tail]) / config.ramp_s))
    vmax = velocity_limits(urdf_xml)
    low, high = model.jnt_range[[model.joint(j).id for j in COMMANDED_JOINTS]].T
    excite = tuple(excite) if excite is not None else COMMANDED_JOINTS
    shapes = np.zeros((len(t), len(COMMANDED_JOINTS)))
    amplitude = np.zeros(len(COMMANDED_JOINTS))
    for c, joint in enumerate(COMMANDED_JOINTS):
        freqs = np.exp(rng.uniform(np.log(config.band_hz[0]), np.log(config.band_hz[1]), config.components))
        phases = rng.uniform(0, 2 * np.pi, config.components)
        shape = sum(np.sin(2 * np.pi * f * t + p) / f for f, p in zip(freqs, phases))
        shapes[:, c] = window * shape / np.max(np.abs(shape))
        if joint not in excite:
            continue
        wanted = config.amplitude.get(joint, 0.0)
        if joint in ARM_JOINTS:
            room = min(home[joint] - low[c], high[c] - home[joint]) - config.position_margin_rad
        else:
            # the gripper's home is fully open (its upper limit): it closes from there and back
            shapes[:, c] = -window * 0.5 * (1.0 - shape / np.max(np.abs(shape)))
            room = home[joint] - low[c] - 0.002
        amplitude[c] = max(0.0, min(wanted, room))
        peak_speed = np.max(np.abs(np.gradient(shapes[:, c], dt)))
        if joint in vmax and peak_speed > 0:
            amplitude[c] = min(amplitude[c], config.velocity_fraction * vmax[joint] / peak_speed)
        peak_acceleration = np.max(np.abs(np.diff(shapes[:, c], 2))) / dt**2  # as the envelope monitor sees it
        if joint in config.acceleration_limits and peak_acceleration > 0:
            amplitude[c] = min(amplitude[c], config.acceleration_limits[joint] / peak_acceleration)
    center = np.array([home[j] for j in COMMANDED_JOINTS])
    checker = WorkspaceChecker(model, table_height_m)
    for _ in range(12):
        positions = center + shapes * amplitude
        problems = _first_violation(checker, positions, config.min_tcp_height_m)
        if not problems:
            return JointTrajectory(t, COMMANDED_JOINTS, positions)
        amplitude *= 0.8
    raise ExcitationError(f"the excitation stays unsafe even at 7 % of the configured amplitudes ({problems}); "
                          "lower the amplitudes in the excitation file or change the home pose")


def _first_violation(checker: WorkspaceChecker, positions: np.ndarray, min_height_m: float) -> str | None:
    for row in positions[::10]:
        values = dict(zip(COMMANDED_JOINTS, row))
        problems = checker.violations(values)
        height = checker.tcp_pose()[0][2] - checker.table_height_m
        if height < min_height_m:
            problems.append(f"hand {height * 100:.1f} cm above the table (< {min_height_m * 100:.0f} cm)")
        if problems:
            return "; ".join(problems)
    return None


# ----------------------------------------------------------------------------- pushes

def solve_ik(checker: WorkspaceChecker, start: Mapping[str, float], position: np.ndarray, rotation: np.ndarray,
             *, iterations: int = 100, tolerance_m: float = 1e-6) -> dict[str, float]:
    """Arm joint positions that put the tool centre point at `position` with `rotation`
    (damped least squares on the MuJoCo model; the fingers keep their value). The tolerance
    is far below one command step's motion: a looser one leaves the joints still for a few
    steps and then jumps (a staircase whose accelerations the envelope monitor rejects)."""
    model, data = checker.model, checker.data
    q = dict(start)
    dofs = model.jnt_dofadr[[model.joint(j).id for j in ARM_JOINTS]]
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    for _ in range(iterations):
        checker.set(q)
        current, current_rot = checker.tcp_pose()
        error_p = position - current
        error_r = 0.5 * sum(np.cross(current_rot[:, i], rotation[:, i]) for i in range(3))
        if np.linalg.norm(error_p) < tolerance_m and np.linalg.norm(error_r) < 1e-5:
            return q
        mujoco.mj_jacBody(model, data, jacp, jacr, model.body(TCP_BODY).id)
        jac = np.vstack([jacp[:, dofs], jacr[:, dofs]])
        error = np.concatenate([error_p, error_r])
        step = jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(6), error)
        for joint, dq in zip(ARM_JOINTS, step):
            q[joint] += float(np.clip(dq, -0.2, 0.2))
    raise ExcitationError(f"no joint solution puts the hand at {np.round(position, 3).tolist()}: move the box "
                          "closer to the robot or change the push")


def _min_jerk(a: np.ndarray, b: np.ndarray, steps: int) -> np.ndarray:
    s = np.linspace(0.0, 1.0, max(steps, 2))
    blend = 10 * s**3 - 15 * s**4 + 6 * s**5
    return a[None, :] + (b - a)[None, :] * blend[:, None]


def motion_limits(config: JointExcitationConfig, urdf_xml: str) -> tuple[dict[str, float], dict[str, float]]:
    """(speed, acceleration) limits of the commanded joints that trajectories keep to:
    velocity_fraction of the URDF velocity limits, and the configured acceleration limits."""
    vmax = velocity_limits(urdf_xml)
    speed = {j: config.velocity_fraction * vmax[j] for j in COMMANDED_JOINTS if j in vmax}
    return speed, {j: config.acceleration_limits[j] for j in COMMANDED_JOINTS if j in config.acceleration_limits}


def push_trajectory(push: PushConfig, box_xyz: np.ndarray, box_half_size_m: float, home: Mapping[str, float],
                    checker: WorkspaceChecker, *, max_speed: Mapping[str, float],
                    max_acceleration: Mapping[str, float], command_rate_hz: float = 250.0,
                    approach_height_m: float = 0.08, clearance_m: float = 0.03) -> JointTrajectory:
    """Home -> above the pre-push point -> down -> push through the box -> up -> home.

    The fingers close on the way to the box (a closed hand pushes with both pads) and open
    on the way back. Straight Cartesian segments (minimum-jerk in time), IK at every
    command, warm-started. A segment whose joint motion would exceed `max_speed` or
    `max_acceleration` (per command step, as the envelope monitor checks them) is slowed
    down until it does not; the push itself then runs slower than `speed_m_s`, and the
    returned trajectory's `slowed` says by how much.
    """
    direction = np.array([math.cos(math.radians(push.direction_deg)), math.sin(math.radians(push.direction_deg)), 0.0])
    lateral = np.array([-direction[1], direction[0], 0.0])
    finger_half_m = 0.012  # closed fingers: half the pad depth along the push
    start = box_xyz - direction * (box_half_size_m + finger_half_m + clearance_m) + lateral * push.offset_m
    # At the mid-height of a box resting on the table, whatever its measured height: a box
    # that settles a few mm into a soft table (or a noisy pose) would otherwise take the hand
    # below the monitor's workspace floor (config/envelope.yaml, 5 mm below mid-height).
    start[2] = max(box_xyz[2], checker.table_height_m + box_half_size_m)
    end = start + direction * (clearance_m + push.distance_m)
    lift = np.array([0.0, 0.0, approach_height_m])
    closed = dict(home, **{GRIPPER_JOINT: 0.0})
    checker.set(closed)
    _, rotation = checker.tcp_pose()
    dt = 1.0 / command_rate_hz
    gripper = COMMANDED_JOINTS.index(GRIPPER_JOINT)
    speed, accel = _limit_arrays(max_speed, max_acceleration, COMMANDED_JOINTS)
    segments = [(start + lift, 1.0), (start, 0.6), (end, (clearance_m + push.distance_m) / push.speed_m_s),
                (end, 0.5), (end + lift, 0.5)]
    try:
        parts, stretched = _cartesian_path(checker, closed, segments, rotation, dt, speed, accel, gripper=None)
    except ExcitationError as error:
        raise ExcitationError(f"push {push}: {error}; move the box or change the push") from None
    slowed = max(1.0, stretched[2] * push.speed_m_s / (clearance_m + push.distance_m))
    out = np.vstack(parts)
    # Minimum-jerk closing: peak speed 1.875 d/T, peak acceleration 5.77 d/T^2.
    travel = abs(home[GRIPPER_JOINT])
    closing_s = max(0.5, 1.875 * travel / speed[gripper] * 1.05, math.sqrt(5.77 * travel / accel[gripper]) * 1.05)
    closing = min(len(out), int(round(closing_s / dt)))
    out[:closing, gripper] = _min_jerk(np.array([home[GRIPPER_JOINT]]), np.array([0.0]), closing)[:, 0]
    out[closing:, gripper] = 0.0
    positions = _then_home(out, home, dt, speed, accel)
    return JointTrajectory(np.arange(len(positions)) * dt, COMMANDED_JOINTS, positions, slowed)


def _limit_arrays(max_speed: Mapping[str, float], max_acceleration: Mapping[str, float],
                  joints) -> tuple[np.ndarray, np.ndarray]:
    """Per-joint speed and acceleration limits in `joints` order (unlimited where not given)."""
    return (np.array([max_speed.get(j, np.inf) for j in joints]),
            np.array([max_acceleration.get(j, np.inf) for j in joints]))


def _then_home(rows: np.ndarray, home: Mapping[str, float], dt: float, speed: np.ndarray,
               accel: np.ndarray) -> np.ndarray:
    """`rows` followed by a minimum-jerk move (at least 1.2 s, within the limits) back to home."""
    back = _min_jerk_within(rows[-1], np.array([home[j] for j in COMMANDED_JOINTS]), int(round(1.2 / dt)), dt,
                            speed, accel)
    return np.vstack([rows, back[1:]])


def _cartesian_path(checker: WorkspaceChecker, q: dict, segments: list[tuple], rotation: np.ndarray, dt: float,
                    speed: np.ndarray, accel: np.ndarray, *, gripper: int | None) -> tuple[list[np.ndarray], list[float]]:
    """Straight Cartesian segments [(target, duration[, gripper target])] one after another
    from the joint positions `q`, each slowed down until its joint motion keeps to `speed`
    and `accel` per command step (as the envelope monitor checks them). With `gripper` (its
    column), a segment's third entry moves the fingers by minimum jerk within it. Returns the
    rows of each segment and each segment's duration."""
    parts, durations = [], []
    finger = float(q.get(GRIPPER_JOINT, 0.0))
    for index, (target, duration, *grip) in enumerate(segments):
        checker.set(q)
        begin = checker.tcp_pose()[0]
        for _ in range(8):
            rows, q_end = _cartesian_segment(checker, q, begin, target, rotation, duration, dt)
            if gripper is not None and grip:
                s = np.linspace(0.0, 1.0, len(rows) + 1)[1:]
                rows[:, gripper] = finger + (grip[0] - finger) * (10 * s**3 - 15 * s**4 + 6 * s**5)
            stretch = _stretch_needed(np.vstack([parts[-1][-1:] if parts else [rows[0]], rows]), dt, speed, accel,
                                      skip=-1 if gripper is not None else COMMANDED_JOINTS.index(GRIPPER_JOINT))
            if stretch <= 1.0:
                break
            duration *= stretch * 1.05
        else:
            raise ExcitationError(f"segment {index} stays beyond the joint speed/acceleration limits even slowed "
                                  "down 8 times")
        if gripper is not None and grip:
            finger = float(grip[0])
            q_end = dict(q_end, **{GRIPPER_JOINT: finger})
        parts.append(rows)
        durations.append(duration)
        q = q_end
    return parts, durations


def lift_trajectory(lift: LiftConfig, box_xyz: np.ndarray, box_half_size_m: float, home: Mapping[str, float],
                    checker: WorkspaceChecker, *, max_speed: Mapping[str, float],
                    max_acceleration: Mapping[str, float], command_rate_hz: float = 250.0,
                    approach_height_m: float = 0.1) -> JointTrajectory:
    """Home -> above the box (fingers open) -> down around it -> close -> lift -> hold ->
    set down where it was -> open -> up -> home. The hand keeps its home orientation, so the
    fingers close on the box's faces when the box sits square to the robot (yaw 0) as it
    does after pushes along x and y. The fingers are commanded `squeeze_m` past the faces:
    the grip holds the box by the finger gain times that. Segments are slowed down to the
    joint speed and acceleration limits like a push's."""
    opened = float(home[GRIPPER_JOINT])
    if box_half_size_m >= opened:
        raise ExcitationError(f"a box {2 * box_half_size_m:.3f} m wide does not fit between the open fingers "
                              f"({2 * opened:.3f} m): remove the lifts from the excitation")
    at = np.array(box_xyz, dtype=float)
    at[2] = max(at[2], checker.table_height_m + box_half_size_m)
    above, up = at + [0.0, 0.0, approach_height_m], at + [0.0, 0.0, lift.height_m]
    grip = max(0.0, box_half_size_m - lift.squeeze_m)
    checker.set(dict(home))
    _, rotation = checker.tcp_pose()
    dt = 1.0 / command_rate_hz
    gripper = COMMANDED_JOINTS.index(GRIPPER_JOINT)
    speed, accel = _limit_arrays(max_speed, max_acceleration, COMMANDED_JOINTS)
    segments = [(above, 1.2, opened), (at, 1.0, opened), (at, 0.8, grip), (up, 1.2, grip), (up, lift.hold_s, grip),
                (at, 1.2, grip), (at, 0.6, opened), (above, 0.8, opened)]
    try:
        parts, _ = _cartesian_path(checker, dict(home), segments, rotation, dt, speed, accel, gripper=gripper)
    except ExcitationError as error:
        raise ExcitationError(f"lift {lift}: {error}; move the box closer or lower the lift") from None
    out = np.vstack(parts)
    positions = _then_home(out, home, dt, speed, accel)
    return JointTrajectory(np.arange(len(positions)) * dt, COMMANDED_JOINTS, positions)


def box_excitation(config: ExcitationConfig, box_half_size_m: float, home: Mapping[str, float],
                   checker: WorkspaceChecker, *, max_speed: Mapping[str, float],
                   max_acceleration: Mapping[str, float],
                   command_rate_hz: float = 250.0) -> list[Callable[[np.ndarray], JointTrajectory]]:
    """The configured pushes, then the lifts, each as a planner of the box's current
    position: played one after another, each starts from where the one before left the box."""
    limits = dict(max_speed=max_speed, max_acceleration=max_acceleration, command_rate_hz=command_rate_hz)
    planners: list[Callable[[np.ndarray], JointTrajectory]] = [
        lambda box, push=push: push_trajectory(push, box, box_half_size_m, home, checker, **limits)
        for push in config.pushes]
    planners += [lambda box, lift=lift: lift_trajectory(lift, box, box_half_size_m, home, checker, **limits)
                 for lift in config.lifts]
    return planners


def approach(start: Mapping[str, float], trajectory: JointTrajectory, *, max_speed: Mapping[str, float],
             max_acceleration: Mapping[str, float],
             plan_move: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
             log: Callable[[str], None] = lambda message: None) -> JointTrajectory | None:
    """A move from the measured `start` to the trajectory's first row, within the limits;
    None when the robot is close enough that stepping straight to the first row takes under
    half the speed limit. The envelope monitor checks a stream's first target against the
    measured position: a gripper resting 0.4 mm short of its target read as 0.11 m/s over
    one 4 ms step and was rejected.

    `plan_move(here, first)`: the motion planner's targets (one per row period, `here`
    first), collision-free in the scene and checked against the envelope; it raises
    ValueError when it cannot (e.g. a start the planner finds too near the table or the box,
    where the last push ended): then, as without a planner, a straight minimum-jerk move."""
    first = trajectory.positions[0]
    here = np.array([start.get(j, first[i]) for i, j in enumerate(trajectory.joints)])
    dt = trajectory.t[1] - trajectory.t[0]
    speed, accel = _limit_arrays(max_speed, max_acceleration, trajectory.joints)
    if np.all(np.abs(first - here) <= 0.5 * speed * dt):
        return None
    rows = None
    if plan_move is not None:
        try:
            rows = np.asarray(plan_move(here, first))[:-1]  # then the trajectory's first row
        except ValueError as error:
            log(f"approach: straight minimum-jerk move instead of a planned one ({error})")
    if rows is None or len(rows) < 2 or _stretch_needed(np.vstack([rows, first]), dt, speed, accel) > 1.0:
        rows = _min_jerk_within(here, first, max(2, int(round(0.2 / dt))), dt, speed, accel)[:-1]
    return JointTrajectory(np.arange(len(rows)) * dt, trajectory.joints, rows)


def _min_jerk_within(a: np.ndarray, b: np.ndarray, steps: int, dt: float, speed: np.ndarray,
                     accel: np.ndarray) -> np.ndarray:
    """A minimum-jerk move of at least `steps` rows, lengthened by 20 % at a time until its
    per-step speed and acceleration are within the limits."""
    while _stretch_needed(_min_jerk(a, b, steps), dt, speed, accel) > 1.0:
        steps = max(steps + 1, int(steps * 1.2))
    return _min_jerk(a, b, steps)


def _cartesian_segment(checker: WorkspaceChecker, q: dict, begin: np.ndarray, target: np.ndarray,
                       rotation: np.ndarray, duration: float, dt: float) -> tuple[np.ndarray, dict]:
    rows = []
    for s in np.linspace(0.0, 1.0, max(2, int(round(duration / dt))))[1:]:
        blend = 10 * s**3 - 15 * s**4 + 6 * s**5
        q = solve_ik(checker, q, begin + (target - begin) * blend, rotation)
        rows.append(np.array([q[j] for j in COMMANDED_JOINTS]))
    return np.array(rows), q


def _stretch_needed(rows: np.ndarray, dt: float, speed: np.ndarray, accel: np.ndarray, *, skip: int = -1) -> float:
    """Time factor that brings per-step speed and acceleration of `rows` within the limits
    (speed scales with 1/k, acceleration with 1/k^2); <= 1 when they already are."""
    if len(rows) < 3:
        return 0.0
    v = np.abs(np.diff(rows, axis=0)) / dt
    a = np.abs(np.diff(rows, 2, axis=0)) / dt**2
    keep = np.arange(rows.shape[1]) != skip
    return float(max(np.max(v.max(0)[keep] / speed[keep]), np.sqrt(np.max(a.max(0)[keep] / accel[keep]))))


# ----------------------------------------------------------------------------- scan

# Wrist-camera views of the table for a geometry scan: home, and home with the arm swung
# left and right (joint 1) and the hand higher and lower (joints 4 and 6 together, which
# keeps the camera looking down at the table). (joint 1 offset rad, joint 4 rad, joint 6 rad)
SCAN_VIEWS = tuple((swing, elbow, wrist) for swing in (-0.35, 0.0, 0.35)
                   for elbow, wrist in ((-2.356, 1.571), (-2.0, 1.9), (-2.6, 1.3)))


def scan_view_positions(home: Mapping[str, float]) -> list[dict[str, float]]:
    """Joint positions of every scan view (home first)."""
    return [dict(home)] + [dict(home, panda_joint1=home["panda_joint1"] + swing, panda_joint4=elbow,
                                panda_joint6=wrist) for swing, elbow, wrist in SCAN_VIEWS]


def scan_trajectory(home: Mapping[str, float], checker: WorkspaceChecker, *, max_speed: Mapping[str, float],
                    max_acceleration: Mapping[str, float], command_rate_hz: float = 250.0,
                    hold_s: float = 1.0,
                    plan_move: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None) -> JointTrajectory:
    """Home -> each scan view in turn (held `hold_s` still for sharp, synchronized frames) -> home.

    Every view is checked against the twin's scene (no contact, hand above the table). The
    moves between them: `plan_move(here, there)` (the motion planner's targets, one per
    command period, `here` first; it raises ValueError when it cannot: the scan is then
    refused with its reason), else minimum-jerk within the speed and acceleration limits."""
    views = scan_view_positions(home)
    for index, view in enumerate(views):
        problems = checker.violations(view)
        if problems:
            raise ExcitationError(f"scan view {index} ({view}) is not reachable safely: {'; '.join(problems)}")
    dt = 1.0 / command_rate_hz
    speed, accel = _limit_arrays(max_speed, max_acceleration, COMMANDED_JOINTS)
    current = np.array([views[0][j] for j in COMMANDED_JOINTS])
    rows = [current[None, :]]
    hold = max(1, int(round(hold_s / dt)))
    for index, view in enumerate([*views[1:], views[0]], start=1):
        target = np.array([view[j] for j in COMMANDED_JOINTS])
        if plan_move is None:
            rows.append(_min_jerk_within(current, target, int(round(1.0 / dt)), dt, speed, accel)[1:])
        else:
            try:
                rows.append(np.asarray(plan_move(current, target))[1:])
            except ValueError as error:
                raise ExcitationError(f"the move to scan view {index % len(views)} cannot be planned: {error}") from None
        rows.append(np.repeat(target[None, :], hold, axis=0))
        current = target
    positions = np.vstack(rows)
    return JointTrajectory(np.arange(len(positions)) * dt, COMMANDED_JOINTS, positions)
