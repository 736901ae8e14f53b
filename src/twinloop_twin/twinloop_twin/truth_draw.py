"""Truth files drawn from a seeded distribution of plausible workcells.

Pure Python (no rclpy, no MuJoCo). A test or benchmark that runs the loop under "any
plausible physics" draws a hidden truth here, writes it as a physics YAML (the layout of
config/nominal_physics.yaml, accepted by twinloop_twin.physics.load_physics) and serves
it with the emulated workcell. The same seed always gives the same file, so a failure is
reproduced from the seed alone.

The distribution (`TruthRanges`): every joint coefficient and gain log-uniform within a
factor 0.5-2 of the nominal model (a real cell is rarely off by more than 2x from the
data sheet, and a factor is the natural scale of a gain or a friction); the command
delay uniform in 1-40 ms (a controller on the same PC up to a congested network); box
mass and the two friction coefficients uniform within plausible ranges for a cardboard
box on a table pushed by rubber finger pads; sensor noise log-uniform within a factor
0.5-2 of a reference sensor (the nominal model is noise-free, and a factor of zero is no
sensor).

Camera mounts (`draw_camera_offsets`, drawn apart so that the physics of a seed never
changes): each camera off the mount the description gives by a translation of uniform
length within `translation_mm` in a uniform direction and a rotation of uniform angle
within `rotation_deg` about a uniform axis (a camera bumped or mounted by hand), for a
loop whose calibration has to find them.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import yaml
from scipy.spatial.transform import Rotation

from twinloop_twin.physics import (ALL_JOINTS, BoxPhysics, CameraOffset, JointPhysics, SensorNoise, UnmodelledEffects,
                                   WorkcellPhysics, physics_to_dict)


@dataclass(frozen=True)
class TruthRanges:
    joint_factor: tuple[float, float] = (0.5, 2.0)   # x nominal: friction loss, damping, armature, kp, kv
    command_delay_ms: tuple[float, float] = (1.0, 40.0)
    box_mass_kg: tuple[float, float] = (0.25, 1.0)
    box_friction: tuple[float, float] = (0.2, 0.8)    # box on table, sliding
    finger_friction: tuple[float, float] = (0.5, 1.5)  # finger pads on the box, sliding
    noise_factor: tuple[float, float] = (0.5, 2.0)    # x reference_noise


# A reference sensor: the encoders and RGB-D camera of config/emulated_truth.yaml.
REFERENCE_NOISE = SensorNoise(joint_position_std_rad=5.0e-05, joint_velocity_std_rad_s=0.002,
                              joint_effort_std_nm=0.05, depth_std_m=0.002, color_std=2.0)


def draw_truth(nominal: WorkcellPhysics, seed: int, ranges: TruthRanges = TruthRanges(),
               reference_noise: SensorNoise = REFERENCE_NOISE) -> WorkcellPhysics:
    """One plausible workcell around `nominal`, fully determined by `seed`."""
    rng = np.random.default_rng(seed)

    def factor(bounds: tuple[float, float]) -> float:
        return math.exp(rng.uniform(math.log(bounds[0]), math.log(bounds[1])))

    def uniform(bounds: tuple[float, float]) -> float:
        return float(rng.uniform(*bounds))

    joints = {}
    for name in ALL_JOINTS:  # a fixed order: the draw depends on the seed only
        joint = nominal.joints[name]
        joints[name] = JointPhysics(
            friction_loss=_round(joint.friction_loss * factor(ranges.joint_factor)),
            damping=_round(joint.damping * factor(ranges.joint_factor)),
            armature=_round(joint.armature * factor(ranges.joint_factor)),
            kp=None if joint.kp is None else _round(joint.kp * factor(ranges.joint_factor)),
            kv=None if joint.kv is None else _round(joint.kv * factor(ranges.joint_factor)))
    return WorkcellPhysics(
        joints=joints,
        # tenths of a millisecond: the file reads as written; MuJoCo resolves whole 1 ms steps
        command_delay_s=round(uniform(ranges.command_delay_ms), 1) / 1000.0,
        box=BoxPhysics(mass_kg=_round(uniform(ranges.box_mass_kg)), friction=_round(uniform(ranges.box_friction))),
        finger_friction=_round(uniform(ranges.finger_friction)),
        noise=SensorNoise(**{key: _round(value * factor(ranges.noise_factor))
                             for key, value in vars(reference_noise).items()}),
        source=f"truth_draw seed {seed}")


# How far a drawn camera sits from its described mount: (least, most) translation in mm and
# rotation in deg. A fixed camera on a stand is bumped further than one bolted to the hand.
CAMERA_OFFSET_RANGES = {"static_camera": ((8.0, 20.0), (1.0, 2.0)), "wrist_camera": ((2.0, 6.0), (0.3, 1.0))}


def draw_camera_offsets(seed: int, ranges: dict[str, tuple[tuple[float, float], tuple[float, float]]] | None = None
                        ) -> tuple[CameraOffset, ...]:
    """Each camera of `ranges` (default CAMERA_OFFSET_RANGES) off its mount, fully determined
    by `seed` (its own stream: the physics draw of the same seed is unchanged)."""
    rng = np.random.default_rng([seed, 1])
    offsets = []
    for camera, (translation_mm, rotation_deg) in (ranges or CAMERA_OFFSET_RANGES).items():
        direction, axis = (v / np.linalg.norm(v) for v in rng.normal(size=(2, 3)))
        xyz = direction * rng.uniform(*translation_mm) / 1000.0
        angle = math.radians(rng.uniform(*rotation_deg))
        # URDF rpy (fixed axes x, y, z) of the rotation by `angle` about `axis`
        rpy = Rotation.from_rotvec(angle * axis).as_euler("xyz", degrees=True)
        offsets.append(CameraOffset(camera, tuple(round(float(v), 5) for v in xyz),
                                    tuple(round(float(v), 4) for v in rpy)))
    return tuple(offsets)


def with_camera_offsets(physics: WorkcellPhysics, offsets: tuple[CameraOffset, ...]) -> WorkcellPhysics:
    """`physics` with its cameras off their mounts (its other unmodelled effects kept)."""
    effects = physics.unmodelled or UnmodelledEffects()
    return dataclasses.replace(physics, unmodelled=dataclasses.replace(effects, camera_offsets=offsets))


def truth_yaml(physics: WorkcellPhysics, *, seed: int) -> str:
    """The physics YAML of a drawn truth, with a header saying how to draw it again."""
    header = (f"# Drawn truth (twinloop_twin.truth_draw.draw_truth, seed {seed}); same keys and units as\n"
              "# config/nominal_physics.yaml. Draw it again with the same seed to reproduce a run.\n")
    return header + yaml.safe_dump(physics_to_dict(physics), sort_keys=False)


def describe(physics: WorkcellPhysics, nominal: WorkcellPhysics) -> str:
    """The drawn values, one line per joint with each value's factor over nominal, then the rest."""
    lines = [f"{physics.source}: command delay {physics.command_delay_s * 1e3:.1f} ms "
             f"(nominal {nominal.command_delay_s * 1e3:.1f}); box {physics.box.mass_kg:.3f} kg, friction "
             f"{physics.box.friction:.3f}; finger friction {physics.finger_friction:.3f}"]
    for name, joint in physics.joints.items():
        base = nominal.joints[name]
        cells = []
        for key in ("friction_loss", "damping", "armature", "kp", "kv"):
            value, reference = getattr(joint, key), getattr(base, key)
            if value is not None:
                cells.append(f"{key} {value:.4g} (x{value / reference:.2f})")
        lines.append(f"  {name:20s} " + ", ".join(cells))
    noise = ", ".join(f"{key} {value:.3g}" for key, value in vars(physics.noise).items())
    lines.append(f"  noise: {noise}")
    for offset in physics.unmodelled.camera_offsets if physics.unmodelled is not None else ():
        lines.append(f"  {offset.camera} off its mount by {np.round(np.array(offset.xyz_m) * 1e3, 1)} mm, "
                     f"rpy {list(offset.rpy_deg)} deg")
    return "\n".join(lines)


def _round(value: float) -> float:
    """Four significant digits: a readable file, far below any tolerance of the loop."""
    return float(f"{value:.4g}")
