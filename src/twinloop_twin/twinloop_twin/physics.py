"""The physics schema of the workcell: what differs between a nominal model and reality.

Pure Python (no rclpy, no MuJoCo). One YAML file per physics hypothesis
(config/nominal_physics.yaml, config/emulated_truth*.yaml) with identical keys; every
value is validated and a bad file raises PhysicsConfigError naming the file and the key.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

ARM_JOINTS: tuple[str, ...] = tuple(f"panda_joint{i}" for i in range(1, 8))
FINGER_JOINTS: tuple[str, ...] = ("panda_finger_joint1", "panda_finger_joint2")
ALL_JOINTS: tuple[str, ...] = ARM_JOINTS + FINGER_JOINTS
# panda_finger_joint2 mimics panda_finger_joint1 (URDF <mimic>): it has no actuator.
MIMIC_JOINTS: tuple[str, ...] = ("panda_finger_joint2",)
COMMANDED_JOINTS: tuple[str, ...] = tuple(j for j in ALL_JOINTS if j not in MIMIC_JOINTS)

_JOINT_KEYS = ("friction_loss", "damping", "armature", "kp", "kv")
_NOISE_KEYS = ("joint_position_std_rad", "joint_velocity_std_rad_s", "joint_effort_std_nm",
               "depth_std_m", "color_std")
_BOX_KEYS = ("mass_kg", "friction")
_TOP_KEYS = ("joints", "command_delay_ms", "box", "finger_friction", "noise")
UNMODELLED_KEY = "unmodelled"  # optional: effects the schema above cannot express (emulated cell only)
_UNMODELLED_KEYS = ("stribeck", "backlash", "payload", "camera_offsets")
_STRIBECK_KEYS = ("static_ratio", "velocity_rad_s")
_BACKLASH_KEYS = ("joint", "width_rad")
_PAYLOAD_KEYS = ("mass_kg", "offset_m")
_CAMERA_OFFSET_KEYS = ("xyz_m", "rpy_deg")


class PhysicsConfigError(ValueError):
    """A physics YAML file is malformed; the message names the file, the key and the fix."""


@dataclass(frozen=True)
class JointPhysics:
    """Per-joint dynamics. Units: revolute N·m, N·m·s/rad, kg·m²; prismatic N, N·s/m, kg."""

    friction_loss: float  # dry (Coulomb) friction torque/force
    damping: float  # viscous friction
    armature: float  # reflected rotor inertia
    kp: float | None  # position gain of the joint's actuator; None for the mimic joint
    kv: float | None  # velocity (damping) gain of the joint's actuator; None for the mimic joint


@dataclass(frozen=True)
class SensorNoise:
    """Standard deviations of zero-mean Gaussian noise added to what the sensors report."""

    joint_position_std_rad: float
    joint_velocity_std_rad_s: float
    joint_effort_std_nm: float
    depth_std_m: float
    color_std: float  # 8-bit intensity levels (0..255 scale)


@dataclass(frozen=True)
class BoxPhysics:
    mass_kg: float
    friction: float  # sliding friction coefficient box–table


@dataclass(frozen=True)
class Stribeck:
    """Static friction above the sliding level at low speed, on every arm joint: an extra
    friction torque (static_ratio - 1) * friction_loss * exp(-(v / velocity_rad_s)^2)
    against the motion (MuJoCo's frictionloss is Coulomb only: one level at every speed)."""

    static_ratio: float  # breakaway / sliding friction, >= 1
    velocity_rad_s: float  # Stribeck velocity: the extra friction falls off over this speed


@dataclass(frozen=True)
class Backlash:
    """Lost motion in one arm joint's transmission: its actuator's position error is felt
    only beyond half the width either way (a dead zone on the position term)."""

    joint: str
    width_rad: float


@dataclass(frozen=True)
class Payload:
    """A mass on the hand that the robot's description (and its gravity compensation) lacks."""

    mass_kg: float
    offset_m: tuple[float, float, float]  # its centre of mass in panda_hand's frame


@dataclass(frozen=True)
class CameraOffset:
    """A camera that is not where the robot's description mounts it (bumped, or mounted by
    hand): its optical frame is the description's moved by this transform, written in the
    description's optical frame (rpy: fixed axes x, y, z, as in URDF). What a camera
    calibration measures; a cell that trusts the description misplaces what it sees."""

    camera: str
    xyz_m: tuple[float, float, float]
    rpy_deg: tuple[float, float, float]


@dataclass(frozen=True)
class UnmodelledEffects:
    """What a real cell has and no parameter of this schema expresses; the emulated workcell
    applies them when its truth file names them (all off when the key is absent). A twin's
    identification cannot represent them: they are what a residual model is for."""

    stribeck: Stribeck | None = None
    backlash: Backlash | None = None
    payload: Payload | None = None
    camera_offsets: tuple[CameraOffset, ...] = ()  # cameras off their described mounts


@dataclass(frozen=True)
class WorkcellPhysics:
    joints: dict[str, JointPhysics]  # one entry per name in ALL_JOINTS
    command_delay_s: float  # transport + controller delay of /joint_command
    box: BoxPhysics
    finger_friction: float  # sliding friction coefficient of the finger pads
    noise: SensorNoise
    source: str = "<dict>"  # where it was loaded from, for error messages and provenance
    unmodelled: UnmodelledEffects | None = None  # the truth file's `unmodelled:` section; None: none


def load_physics(path: Path | str) -> WorkcellPhysics:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise PhysicsConfigError(
            f"{path}: cannot read physics file ({error}); check the path and YAML syntax") from error
    return physics_from_dict(raw, source=str(path))


def physics_from_dict(raw: Any, *, source: str = "<dict>") -> WorkcellPhysics:
    check = _Checker(source)
    top = check.section(raw, "", _TOP_KEYS, optional=(UNMODELLED_KEY,))
    joints_raw = check.section(top["joints"], "joints.", ALL_JOINTS, what="joint")
    box = check.section(top["box"], "box.", _BOX_KEYS)
    noise = check.section(top["noise"], "noise.", _NOISE_KEYS)
    return WorkcellPhysics(
        joints={name: _joint(check, name, joints_raw[name]) for name in ALL_JOINTS},
        command_delay_s=check.non_negative(top["command_delay_ms"], "command_delay_ms") / 1000.0,
        box=BoxPhysics(mass_kg=check.positive(box["mass_kg"], "box.mass_kg"),
                       friction=check.positive(box["friction"], "box.friction")),
        finger_friction=check.positive(top["finger_friction"], "finger_friction"),
        noise=SensorNoise(**{key: check.non_negative(noise[key], f"noise.{key}") for key in _NOISE_KEYS}),
        source=source,
        unmodelled=_unmodelled(check, top[UNMODELLED_KEY]) if top.get(UNMODELLED_KEY) is not None else None,
    )


def physics_to_dict(physics: WorkcellPhysics) -> dict[str, Any]:
    """The YAML layout (command delay in ms); physics_from_dict(physics_to_dict(p)) == p."""
    raw = {
        "joints": {name: asdict(joint) for name, joint in physics.joints.items()},
        "command_delay_ms": physics.command_delay_s * 1000.0,
        "box": asdict(physics.box),
        "finger_friction": physics.finger_friction,
        "noise": asdict(physics.noise),
    }
    if physics.unmodelled is not None:
        effects = asdict(physics.unmodelled)
        if effects.get("payload"):
            effects["payload"]["offset_m"] = list(effects["payload"]["offset_m"])
        effects["camera_offsets"] = {offset.camera: {"xyz_m": list(offset.xyz_m), "rpy_deg": list(offset.rpy_deg)}
                                     for offset in physics.unmodelled.camera_offsets} or None
        raw[UNMODELLED_KEY] = {key: value for key, value in effects.items() if value is not None}
    return raw


def _unmodelled(check: _Checker, raw: Any) -> UnmodelledEffects:
    sections = check.section(raw, f"{UNMODELLED_KEY}.", _UNMODELLED_KEYS, optional=_UNMODELLED_KEYS)
    stribeck = backlash = payload = None
    offsets: list[CameraOffset] = []
    if sections.get("stribeck") is not None:
        prefix = f"{UNMODELLED_KEY}.stribeck."
        values = check.section(sections["stribeck"], prefix, _STRIBECK_KEYS)
        ratio = check.positive(values["static_ratio"], prefix + "static_ratio")
        if ratio < 1.0:
            raise check.error(prefix + "static_ratio", f"must be >= 1, got {ratio}",
                              "static friction is at least the sliding friction")
        stribeck = Stribeck(ratio, check.positive(values["velocity_rad_s"], prefix + "velocity_rad_s"))
    if sections.get("backlash") is not None:
        prefix = f"{UNMODELLED_KEY}.backlash."
        values = check.section(sections["backlash"], prefix, _BACKLASH_KEYS)
        if values["joint"] not in ARM_JOINTS:
            raise check.error(prefix + "joint", f"names {values['joint']!r}, not an arm joint",
                              f"name one of {list(ARM_JOINTS)}")
        backlash = Backlash(values["joint"], check.positive(values["width_rad"], prefix + "width_rad"))
    if sections.get("payload") is not None:
        prefix = f"{UNMODELLED_KEY}.payload."
        values = check.section(sections["payload"], prefix, _PAYLOAD_KEYS)
        offset = values["offset_m"]
        if not isinstance(offset, (list, tuple)) or len(offset) != 3:
            raise check.error(prefix + "offset_m", f"must be a list of 3 numbers, got {offset!r}",
                              "write it as [x, y, z] in metres in panda_hand's frame")
        payload = Payload(check.positive(values["mass_kg"], prefix + "mass_kg"),
                          tuple(check.number(v, f"{prefix}offset_m") for v in offset))
    if sections.get("camera_offsets") is not None:
        prefix = f"{UNMODELLED_KEY}.camera_offsets"
        cameras = sections["camera_offsets"]
        if not isinstance(cameras, Mapping) or not all(isinstance(name, str) for name in cameras):
            raise check.error(prefix, f"must map camera names to offsets, got {cameras!r}",
                              "write e.g. `static_camera: {xyz_m: [0.01, 0.0, 0.0], rpy_deg: [0.0, 1.0, 0.0]}`")
        for name, raw_offset in cameras.items():
            values = check.section(raw_offset, f"{prefix}.{name}.", _CAMERA_OFFSET_KEYS)
            vectors = {}
            for key, unit in (("xyz_m", "metres"), ("rpy_deg", "degrees")):
                vector = values[key]
                if not isinstance(vector, (list, tuple)) or len(vector) != 3:
                    axes = "[x, y, z]" if key == "xyz_m" else "[roll, pitch, yaw] (about fixed x, y, z, as in URDF)"
                    raise check.error(f"{prefix}.{name}.{key}", f"must be a list of 3 numbers, got {vector!r}",
                                      f"write it as {axes} in {unit}, in the camera's described optical frame")
                vectors[key] = tuple(check.number(v, f"{prefix}.{name}.{key}") for v in vector)
            offsets.append(CameraOffset(name, vectors["xyz_m"], vectors["rpy_deg"]))
    return UnmodelledEffects(stribeck, backlash, payload, tuple(offsets))


def _joint(check: _Checker, name: str, raw: Any) -> JointPhysics:
    prefix = f"joints.{name}."
    values = check.section(raw, prefix, _JOINT_KEYS)
    gains: dict[str, float | None] = {}
    for key in ("kp", "kv"):
        if name in MIMIC_JOINTS:
            if values[key] is not None:
                raise check.error(prefix + key, f"must be null, got {values[key]!r}",
                                  f"{name} mimics panda_finger_joint1 and has no actuator; write `{key}: null`")
            gains[key] = None
        else:
            gains[key] = check.positive(values[key], prefix + key)
    return JointPhysics(
        friction_loss=check.non_negative(values["friction_loss"], prefix + "friction_loss"),
        damping=check.non_negative(values["damping"], prefix + "damping"),
        armature=check.non_negative(values["armature"], prefix + "armature"),
        **gains,
    )


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, key: str, problem: str, fix: str) -> PhysicsConfigError:
        return PhysicsConfigError(f"{self.source}: key '{key}' {problem}; {fix}")

    def section(self, raw: Any, prefix: str, keys: tuple[str, ...], *, what: str = "key",
                optional: tuple[str, ...] = ()) -> dict[str, Any]:
        """A mapping with exactly `keys` (those in `optional` may be left out): missing and
        unknown keys are both errors."""
        if not isinstance(raw, Mapping):
            raise self.error(prefix.rstrip(".") or "<top level>", f"must be a mapping, got {type(raw).__name__}",
                             "see config/nominal_physics.yaml for the layout")
        for key in raw:
            if key not in keys + optional:
                raise self.error(f"{prefix}{key}", f"is an unknown {what}",
                                 f"remove it; expected one of {list(keys + optional)}")
        for key in keys:
            if key not in raw and key not in optional:
                raise self.error(f"{prefix}{key}", "is missing",
                                 "add it (every physics file has the same keys as config/nominal_physics.yaml)")
        return dict(raw)

    def number(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            fix = "write a plain number"
            if isinstance(value, str) and _parses_as_float(value):
                fix = f"YAML reads {value} as text: write the mantissa with a dot, e.g. 5.0e-05 not 5e-05"
            raise self.error(key, f"must be a number, got {type(value).__name__} {value!r}", fix)
        if not math.isfinite(value):
            raise self.error(key, f"must be finite, got {value}", "write a finite number")
        return float(value)

    def non_negative(self, value: Any, key: str) -> float:
        number = self.number(value, key)
        if number < 0:
            raise self.error(key, f"must be >= 0, got {number}", "physical coefficients cannot be negative")
        return number

    def positive(self, value: Any, key: str) -> float:
        number = self.number(value, key)
        if number <= 0:
            raise self.error(key, f"must be > 0, got {number}", "write a strictly positive value")
        return number


def _parses_as_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
