"""A twin version's learned residual: joint torques for what its physics cannot express.

Pure Python (numpy, MuJoCo; no rclpy, no torch at run time). A real arm has effects no
parameter of the physics schema (twinloop_twin.physics) expresses: a payload or a cable the
description lacks, friction that rises at low speed, lost motion in a gear. Where
identification leaves a systematic error, the builder (twinloop_builder.residual_fit)
trains a small network on the fit recordings and the version carries it as
`residual.npz`; every consumer that steps the twin (replay, the sim bridge, validation,
training) applies it as generalized forces before each physics step.

The network has two parts, each a two-layer tanh perceptron:
- a wrench at the hand, from the hand's orientation in the world, mapped to the arm's joints
  through the hand's Jacobian (what a payload, a cable or a tool adds: a pose-dependent load
  at the end effector; this form generalises to poses the recordings did not visit);
- a torque in each joint's transmission, from that joint's velocity and position error to
  its (delayed) target and the joint's index (friction shape, backlash).
Joints the builder found no better with it are masked out (`mask`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from twinloop_twin.bundle import TwinError
from twinloop_twin.physics import ARM_JOINTS
from twinloop_twin.scene import command_actuator_ids, delayed_target, joint_dof_addresses, joint_qpos_addresses

RESIDUAL_FILE = "residual.npz"
HAND_BODY = "panda_hand"
FORMAT = 1
_LAYERS = ("wrench", "joint")


class ResidualError(TwinError):
    """A twin version's residual file that cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class ResidualWeights:
    """The trained network as arrays (twinloop_builder.residual_fit writes them)."""

    wrench: tuple[np.ndarray, ...]  # W1 (h, 9), b1, W2 (h, h), b2, W3 (6, h), b3
    joint: tuple[np.ndarray, ...]  # W1 (h, 2 + 7), b1, W2, b2, W3 (1, h), b3
    velocity_scale: np.ndarray  # (7,) rad/s: the transmission part's velocity input is v / scale
    error_scale: np.ndarray  # (7,) rad: its position-error input is e / scale
    mask: np.ndarray  # (7,) 1.0 where the residual is applied, 0.0 where the builder masked it

    def save(self, path: Path | str) -> None:
        arrays = {f"{name}_{i}": a for name in _LAYERS for i, a in enumerate(getattr(self, name))}
        np.savez(path, format=np.array(FORMAT), velocity_scale=self.velocity_scale, error_scale=self.error_scale,
                 mask=self.mask, **arrays)

    def to_bytes(self) -> bytes:
        import io
        buffer = io.BytesIO()
        self.save(buffer)
        return buffer.getvalue()

    @classmethod
    def load(cls, path: Path | str) -> "ResidualWeights":
        try:
            with np.load(path) as data:
                if int(data["format"]) != FORMAT:
                    raise ResidualError(f"{path}: residual format {int(data['format'])}, this suite reads {FORMAT}; "
                                        "rebuild the twin version with this suite")
                layers = {name: tuple(np.asarray(data[f"{name}_{i}"], dtype=float) for i in range(6))
                          for name in _LAYERS}
                weights = cls(**layers, velocity_scale=np.asarray(data["velocity_scale"], dtype=float),
                              error_scale=np.asarray(data["error_scale"], dtype=float),
                              mask=np.asarray(data["mask"], dtype=float))
        except (OSError, KeyError, ValueError) as error:
            if isinstance(error, ResidualError):
                raise
            raise ResidualError(f"{path}: not a readable residual ({error}); rebuild the twin version") from error
        arrays = [*weights.wrench, *weights.joint, weights.velocity_scale, weights.error_scale, weights.mask]
        if not all(np.isfinite(a).all() for a in arrays):
            raise ResidualError(f"{path}: the residual holds NaN or infinite weights; rebuild the twin version")
        return weights


def _mlp(layers: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2, w3, b3 = layers
    return np.tanh(np.tanh(x @ w1.T + b1) @ w2.T + b2) @ w3.T + b3


class ResidualTorque:
    """The residual of one twin on one compiled model; `apply(data)` before each step."""

    def __init__(self, model: mujoco.MjModel, weights: ResidualWeights) -> None:
        self.model, self.weights = model, weights
        self._qpos = joint_qpos_addresses(model, ARM_JOINTS)
        self._dof = joint_dof_addresses(model, ARM_JOINTS)
        self._actuators = command_actuator_ids(model, ARM_JOINTS)
        self._hand = model.body(HAND_BODY).id
        self._one_hot = np.eye(len(ARM_JOINTS))

    def torques(self, rotation: np.ndarray, jacobian: np.ndarray, velocity: np.ndarray,
                error: np.ndarray) -> np.ndarray:
        """(N, 7) joint torques from (N, 9) hand rotations (row-major), (N, 6, 7) hand
        Jacobians (translation rows, then rotation), (N, 7) velocities and position errors."""
        w = self.weights
        wrench = _mlp(w.wrench, rotation)
        local_in = np.concatenate([(velocity / w.velocity_scale)[..., None], (error / w.error_scale)[..., None],
                                   np.broadcast_to(self._one_hot, (len(velocity), 7, 7))], axis=2)
        local = _mlp(w.joint, local_in)[..., 0]
        return (np.einsum("nij,ni->nj", jacobian, wrench) + local) * w.mask

    def features(self, data: mujoco.MjData) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rotation, Jacobian, velocity, error) of one state, each with a leading axis of 1.
        The kinematics are the data's last evaluated ones (mj_step evaluates them at the start
        of each step, so they are one step old; at 1 ms that is far below what matters)."""
        jacobian = np.zeros((6, self.model.nv))
        mujoco.mj_jacBody(self.model, data, jacobian[:3], jacobian[3:], self._hand)
        target = np.array([delayed_target(self.model, data, int(a)) for a in self._actuators])
        return (data.xmat[self._hand][None].copy(), jacobian[:, self._dof][None],
                data.qvel[self._dof][None].copy(), (target - data.qpos[self._qpos])[None])

    def apply(self, data: mujoco.MjData) -> None:
        data.qfrc_applied[:] = 0.0
        data.qfrc_applied[self._dof] = self.torques(*self.features(data))[0]

    def step(self, data: mujoco.MjData, steps: int) -> None:
        for _ in range(steps):
            self.apply(data)
            mujoco.mj_step(self.model, data)


def load_residual(twin, model: mujoco.MjModel) -> ResidualTorque | None:
    """The twin version's residual on `model` (its compiled scene), None when it has none."""
    path = Path(twin.path) / RESIDUAL_FILE
    if not path.is_file():
        return None
    return ResidualTorque(model, ResidualWeights.load(path))
