"""A simulated workcell behind the hardware contract: MuJoCo physics and RGB-D cameras.

Pure Python (no rclpy). The emulated workcell is this simulation run on a hidden "truth"
physics file with sensor noise; the sim bridge serves a twin version through the same
class. Everything random comes from one seeded generator, so a run is reproducible.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import mujoco
import numpy as np

from twinloop_twin.physics import ALL_JOINTS, COMMANDED_JOINTS, SensorNoise, WorkcellPhysics
from twinloop_twin.scene import (command_actuator_ids, compile_workcell, joint_dof_addresses,
                                 joint_qpos_addresses, fill_command_history, reset_to_home)
from twinloop_twin.workcell import CameraIntrinsics, WorkcellDescription

from twinloop_twin.contract import CommandRejected, parse_joint_command

from twinloop_sim.unmodelled import UnmodelledForces
from twinloop_twin.residual import ResidualTorque


NO_NOISE = SensorNoise(joint_position_std_rad=0.0, joint_velocity_std_rad_s=0.0, joint_effort_std_nm=0.0,
                       depth_std_m=0.0, color_std=0.0)


@dataclass(frozen=True)
class JointStateSample:
    names: tuple[str, ...]
    position: np.ndarray  # rad (m for fingers)
    velocity: np.ndarray  # rad/s (m/s)
    effort: np.ndarray  # N·m (N): actuator torque including gravity compensation


class WorkcellSimulation:
    """MuJoCo physics of the workcell, commanded by joint position targets."""

    def __init__(self, workcell: WorkcellDescription, physics: WorkcellPhysics | None = None, *,
                 seed: int = 0, model: mujoco.MjModel | None = None,
                 noise: SensorNoise | None = None, residual: ResidualTorque | None = None) -> None:
        """Built from a physics hypothesis, or from a compiled `model` (a twin's scene).

        Sensor noise comes from `noise`, else from the physics; a twin served without
        either predicts noise-free. `residual`: a twin version's learned residual
        (twinloop_twin.residual.load_residual), applied before every physics step.
        """
        if physics is None and model is None:
            raise ValueError("give a physics hypothesis or a compiled model")
        self.workcell = workcell
        self.noise = noise or (physics.noise if physics is not None else NO_NOISE)
        self.model = model if model is not None else compile_workcell(workcell, physics)
        self.data = mujoco.MjData(self.model)
        self.joint_names = tuple(ALL_JOINTS)
        self.commandable_joints = tuple(COMMANDED_JOINTS)
        self._qpos = joint_qpos_addresses(self.model, self.joint_names)
        self._dof = joint_dof_addresses(self.model, self.joint_names)
        self._actuator = dict(zip(self.commandable_joints,
                                  command_actuator_ids(self.model, self.commandable_joints)))
        self._ctrl_range = {j: tuple(self.model.actuator_ctrlrange[a]) for j, a in self._actuator.items()}
        self._rng = np.random.default_rng(seed)
        effects = physics.unmodelled if physics is not None else None
        forces = UnmodelledForces(self.model, effects) if effects is not None else None
        self._unmodelled = forces if forces is not None and forces.active else None
        if residual is not None and self._unmodelled is not None:
            raise ValueError("a residual belongs to a twin; a truth's unmodelled effects to the emulated cell, not both")
        # what adds generalized forces before each step: the truth's effects or the twin's residual
        self._per_step = self._unmodelled or residual
        self.reset()

    @property
    def time_s(self) -> float:
        return float(self.data.time)

    @property
    def timestep_s(self) -> float:
        return float(self.model.opt.timestep)

    def reset(self, joint_positions: Mapping[str, float] | None = None, *, reset_box: bool = True) -> None:
        """Home pose (optionally overridden per joint), targets equal to the pose, at rest."""
        box_qpos = None if reset_box else self.box_qpos()
        reset_to_home(self.model, self.data)
        for name, value in (joint_positions or {}).items():
            if name not in self.joint_names:
                raise CommandRejected("UNKNOWN_JOINT", f"reset names unknown joint '{name}'; "
                                                       f"joints are {list(self.joint_names)}")
            self.data.qpos[self._qpos[self.joint_names.index(name)]] = value
            if name in self._actuator:
                self.data.ctrl[self._actuator[name]] = value
        if box_qpos is not None:
            self.data.qpos[self._box_qpos_slice()] = box_qpos
        self.data.time = 0.0
        fill_command_history(self.model, self.data)
        mujoco.mj_forward(self.model, self.data)

    def command(self, names: Sequence[str], positions: Sequence[float]) -> dict[str, float]:
        """Apply a validated position command; raises CommandRejected and applies nothing."""
        targets = parse_joint_command(names, positions, self.commandable_joints)
        for name, target in targets.items():
            low, high = self._ctrl_range[name]
            self.data.ctrl[self._actuator[name]] = min(max(target, low), high)
        return targets

    def actuator_targets(self, targets: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """(actuator ids, clamped ctrl values) of validated targets, to apply many times fast."""
        ids = np.array([self._actuator[n] for n in targets], dtype=int)
        values = np.array([min(max(t, self._ctrl_range[n][0]), self._ctrl_range[n][1]) for n, t in targets.items()])
        return ids, values

    def targets(self) -> dict[str, float]:
        return {j: float(self.data.ctrl[a]) for j, a in self._actuator.items()}

    def step_until(self, time_s: float) -> int:
        """Advance the physics to `time_s`; returns the number of steps taken."""
        steps = int(round((time_s - self.data.time) / self.model.opt.timestep))
        self.advance(steps)
        return max(steps, 0)

    def advance(self, steps: int) -> None:
        """`steps` physics steps, with the per-step forces where there are any."""
        if steps > 0 and self._per_step is not None:
            self._per_step.step(self.data, steps)  # its forces change every step
        elif steps > 0:
            mujoco.mj_step(self.model, self.data, nstep=steps)

    def joint_state(self) -> JointStateSample:
        """What the joint encoders and torque sensors report, with the configured noise."""
        noise = self.noise
        n = len(self.joint_names)
        position = self.data.qpos[self._qpos] + self._rng.normal(0.0, noise.joint_position_std_rad, n)
        velocity = self.data.qvel[self._dof] + self._rng.normal(0.0, noise.joint_velocity_std_rad_s, n)
        effort = self.data.qfrc_actuator[self._dof] + self._rng.normal(0.0, noise.joint_effort_std_nm, n)
        if self._unmodelled is not None:
            effort += self._unmodelled.actuator_extra[self._dof]
        return JointStateSample(self.joint_names, position, velocity, effort)

    def true_joint_positions(self) -> dict[str, float]:
        return {n: float(self.data.qpos[a]) for n, a in zip(self.joint_names, self._qpos)}

    @property
    def qpos_addresses(self) -> np.ndarray:
        """qpos indices of `joint_names`, in that order."""
        return self._qpos

    def set_box_position(self, xyz) -> None:
        start = self._box_qpos_slice().start
        self.data.qpos[start:start + 3] = xyz
        mujoco.mj_forward(self.model, self.data)

    def box_qpos(self) -> np.ndarray:
        return self.data.qpos[self._box_qpos_slice()].copy()

    def _box_qpos_slice(self) -> slice:
        if not hasattr(self, "_box_slice"):
            joint = self.model.body(self.workcell.box.link).jntadr[0]
            start = int(self.model.jnt_qposadr[joint])
            self._box_slice = slice(start, start + 7)
        return self._box_slice

    @property
    def box_qpos_slice(self) -> slice:
        """qpos slice of the box's free joint (position xyz, then quaternion wxyz)."""
        return self._box_qpos_slice()


NOISE_BANK = 8  # pre-drawn image noise frames per camera resolution


class CameraRig:
    """Headless RGB-D rendering of the workcell's cameras from a full MuJoCo state.

    Depth is rendered metric (distance along the optical axis, as a rectified depth
    image), noised, clipped to the sensor's range and encoded as 16UC1 millimetres the
    way realsense-ros publishes it.
    """

    def __init__(self, model: mujoco.MjModel, cameras: Mapping[str, CameraIntrinsics],
                 noise: SensorNoise, *, seed: int = 0) -> None:
        self.model = model
        self.data = mujoco.MjData(model)
        self.cameras = dict(cameras)
        self._noise = noise
        self._rng = np.random.default_rng(seed)
        self._renderers: dict[tuple[int, int], mujoco.Renderer] = {}
        self._color_noise: dict[tuple[int, int], np.ndarray] = {}
        self._depth_noise: dict[tuple[int, int], np.ndarray] = {}
        for intrinsics in self.cameras.values():
            size = (intrinsics.height, intrinsics.width)
            if size not in self._renderers:
                self._renderers[size] = mujoco.Renderer(model, *size)
                self._make_noise_bank(size)

    def set_state(self, qpos: np.ndarray) -> None:
        self.data.qpos[:] = qpos
        mujoco.mj_kinematics(self.model, self.data)
        mujoco.mj_camlight(self.model, self.data)

    def render(self, camera: str) -> tuple[np.ndarray, np.ndarray]:
        """(rgb uint8 HxWx3, depth uint16 HxW in mm; 0 = no return)."""
        intrinsics = self.cameras[camera]
        renderer = self._renderers[(intrinsics.height, intrinsics.width)]
        renderer.disable_depth_rendering()
        renderer.update_scene(self.data, camera=camera)
        rgb = renderer.render()
        renderer.enable_depth_rendering()
        renderer.update_scene(self.data, camera=camera)
        depth_m = renderer.render()
        renderer.disable_depth_rendering()
        return self._noisy_color(rgb), self._noisy_depth_mm(depth_m, intrinsics)

    def _make_noise_bank(self, size: tuple[int, int]) -> None:
        # Drawing 0.9 M Gaussian samples costs ~9 ms, a third of a render here; frames draw
        # from a bank of pre-drawn noise instead (a random bank entry, rolled by a random row).
        height, width = size
        self._color_noise[size] = np.round(self._rng.normal(
            0.0, self._noise.color_std, (NOISE_BANK, height, width, 3))).astype(np.int16)
        self._depth_noise[size] = self._rng.normal(
            0.0, self._noise.depth_std_m, (NOISE_BANK, height, width)).astype(np.float32)

    def _noise_sample(self, bank: np.ndarray) -> np.ndarray:
        return np.roll(bank[self._rng.integers(NOISE_BANK)], self._rng.integers(bank.shape[1]), axis=0)

    def _noisy_color(self, rgb: np.ndarray) -> np.ndarray:
        if self._noise.color_std <= 0:
            return rgb
        noisy = rgb + self._noise_sample(self._color_noise[rgb.shape[:2]])
        return np.clip(noisy, 0, 255).astype(np.uint8)

    def _noisy_depth_mm(self, depth_m: np.ndarray, intrinsics: CameraIntrinsics) -> np.ndarray:
        if self._noise.depth_std_m > 0:
            depth_m = depth_m + self._noise_sample(self._depth_noise[depth_m.shape])
        valid = (depth_m >= intrinsics.depth_min_m) & (depth_m <= intrinsics.depth_max_m)
        return np.where(valid, np.round(depth_m * 1000.0), 0).astype(np.uint16)

    def close(self) -> None:
        for renderer in self._renderers.values():
            renderer.close()
        self._renderers.clear()
