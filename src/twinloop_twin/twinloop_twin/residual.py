"""A twin version's learned residual: joint torques for what its physics cannot express.

Pure Python (numpy, MuJoCo; no rclpy, no torch at run time). A real arm has effects no
parameter of the physics schema (twinloop_twin.physics) expresses: a payload or a cable the
description lacks, friction that rises at low speed, lost motion in a gear. Where
identification leaves a systematic error, the builder (twinloop_builder.residual_fit)
trains a small network on the fit recordings and the version carries it as
`residual.npz`; every consumer that steps the twin (replay, the sim bridge, validation,
training) applies it as generalized forces before each physics step.

The residual has three parts:
- a point mass on the hand the description lacks (a payload, a tool): its mass and its
  place in the hand's frame. Its inertia is added to the hand's body in the model (so the
  simulator integrates it implicitly: a force from the last step's acceleration would lag
  it), its weight is a generalized force through the point's Jacobian (the robot's gravity
  compensation covers the links it knows, not this);
- a wrench at the hand, from the hand's orientation in the world, mapped to the arm's joints
  through the hand's Jacobian (what a cable or a tool's pull adds: a pose-dependent load
  at the end effector; this form generalises to poses the recordings did not visit), a
  two-layer tanh perceptron;
- a torque in each joint's transmission, from that joint's velocity and position error to
  its (delayed) target and the joint's index (friction shape, backlash), another. Each of
  the two inputs enters twice: over its spread in the fit recordings, and through
  asinh(x / (spread / fine_ratio)), which resolves what happens within a small part of the
  range (a dead zone of a few mrad where the errors span tens, friction that changes
  below a small speed) that a tanh network fed the first form alone smooths away
  (`transmission_inputs`).
Joints the builder found no better with the two networks are masked out of them (`mask`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import mujoco
import numpy as np

from twinloop_twin.bundle import TwinError
from twinloop_twin.physics import ARM_JOINTS
from twinloop_twin.scene import command_actuator_ids, delayed_target, joint_dof_addresses, joint_qpos_addresses

RESIDUAL_FILE = "residual.npz"
HAND_BODY = "panda_hand"
FORMAT = 2  # 2: the transmission part's fine inputs (fine_ratio); 1 (read too): without them
_MASS_MATCH_KG = 1e-9  # a hand mass this close to the expected one is that mass
_LAYERS = ("wrench", "joint")
_ONE_HOT = np.eye(len(ARM_JOINTS))  # the transmission part's joint index (built once: it is on the per-step path)


class ResidualError(TwinError):
    """A twin version's residual file that cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class ResidualWeights:
    """The trained network as arrays (twinloop_builder.residual_fit writes them)."""

    wrench: tuple[np.ndarray, ...]  # W1 (h, 9), b1, W2 (h, h), b2, W3 (6, h), b3
    joint: tuple[np.ndarray, ...]  # W1 (h, 4 + 7) (2 + 7 where fine_ratio is 0), b1, W2, b2, W3 (1, h), b3
    velocity_scale: np.ndarray  # (7,) rad/s: the transmission part's velocity input is v / scale
    error_scale: np.ndarray  # (7,) rad: its position-error input is e / scale
    mask: np.ndarray  # (7,) 1.0 where the networks are applied, 0.0 where the builder masked them
    # the point mass on the hand: [mass kg, x, y, z m in the hand's frame, the hand body's
    # own mass kg in the model it was fit on]; a mass of 0: none
    payload: np.ndarray = field(default_factory=lambda: np.zeros(5))
    # the fine inputs asinh(x / (scale / fine_ratio)) beside x / scale; 0: none (format 1)
    fine_ratio: float = 0.0

    def save(self, path: Path | str) -> None:
        arrays = {f"{name}_{i}": a for name in _LAYERS for i, a in enumerate(getattr(self, name))}
        np.savez(path, format=np.array(FORMAT), velocity_scale=self.velocity_scale, error_scale=self.error_scale,
                 mask=self.mask, payload=self.payload, fine_ratio=np.array(self.fine_ratio), **arrays)

    def to_bytes(self) -> bytes:
        import io
        buffer = io.BytesIO()
        self.save(buffer)
        return buffer.getvalue()

    @classmethod
    def load(cls, path: Path | str) -> "ResidualWeights":
        try:
            with np.load(path) as data:
                if int(data["format"]) not in (1, FORMAT):
                    raise ResidualError(f"{path}: residual format {int(data['format'])}, this suite reads 1 and "
                                        f"{FORMAT}; rebuild the twin version with this suite")
                layers = {name: tuple(np.asarray(data[f"{name}_{i}"], dtype=float) for i in range(6))
                          for name in _LAYERS}
                weights = cls(**layers, velocity_scale=np.asarray(data["velocity_scale"], dtype=float),
                              error_scale=np.asarray(data["error_scale"], dtype=float),
                              mask=np.asarray(data["mask"], dtype=float),
                              # (written before the point mass was part of the residual: none)
                              payload=np.asarray(data["payload"], dtype=float) if "payload" in data
                              else np.zeros(5),
                              fine_ratio=float(data["fine_ratio"]) if "fine_ratio" in data else 0.0)
        except (OSError, KeyError, ValueError) as error:
            if isinstance(error, ResidualError):
                raise
            raise ResidualError(f"{path}: not a readable residual ({error}); rebuild the twin version") from error
        arrays = [*weights.wrench, *weights.joint, weights.velocity_scale, weights.error_scale, weights.mask,
                  weights.payload]
        if not all(np.isfinite(a).all() for a in arrays):
            raise ResidualError(f"{path}: the residual holds NaN or infinite weights; rebuild the twin version")
        if weights.payload.shape != (5,) or weights.payload[0] < 0.0:
            raise ResidualError(f"{path}: the residual's payload is not [mass >= 0, x, y, z, hand mass]; rebuild the "
                                "twin version")
        inputs = (4 if weights.fine_ratio > 0.0 else 2) + len(ARM_JOINTS)
        if not np.isfinite(weights.fine_ratio) or weights.fine_ratio < 0.0 or weights.joint[0].shape[1] != inputs:
            raise ResidualError(f"{path}: the residual's transmission part takes {weights.joint[0].shape[1]} inputs "
                                f"where its fine_ratio {weights.fine_ratio:g} means {inputs}; rebuild the twin version")
        return weights

    @classmethod
    def load_only(cls, payload: np.ndarray) -> "ResidualWeights":
        """A residual that is the load on the hand alone (its networks zero and masked)."""
        zero = (np.zeros((1, 9)), np.zeros(1), np.zeros((1, 1)), np.zeros(1))
        return cls((*zero, np.zeros((6, 1)), np.zeros(6)), (*zero, np.zeros((1, 1)), np.zeros(1)), np.ones(7),
                   np.ones(7), np.zeros(7), np.asarray(payload, dtype=float))  # (fine_ratio 0: 2 + 7 inputs)

    @property
    def payload_mass_kg(self) -> float:
        return float(self.payload[0])

    @property
    def payload_offset_m(self) -> np.ndarray:
        return self.payload[1:4]


def transmission_inputs(velocity: np.ndarray, error: np.ndarray, velocity_scale: np.ndarray,
                        error_scale: np.ndarray, fine_ratio: float) -> np.ndarray:
    """(N, 7, k + 7) the transmission network's inputs from (N, 7) joint velocities and
    position errors: v / velocity_scale, e / error_scale, where fine_ratio > 0 also
    asinh(v / (velocity_scale / fine_ratio)) and asinh(e / (error_scale / fine_ratio)),
    then the joint's index one-hot."""
    parts = [velocity / velocity_scale, error / error_scale]
    if fine_ratio > 0.0:
        parts += [np.arcsinh(velocity * fine_ratio / velocity_scale), np.arcsinh(error * fine_ratio / error_scale)]
    return np.concatenate([*(p[..., None] for p in parts), np.broadcast_to(_ONE_HOT, (len(velocity), *_ONE_HOT.shape))],
                          axis=2)


def _mlp(layers: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
    w1, b1, w2, b2, w3, b3 = layers
    return np.tanh(np.tanh(x @ w1.T + b1) @ w2.T + b2) @ w3.T + b3


def payload_torques(mass_kg: float, offset_m: np.ndarray, rotation: np.ndarray, jacobian: np.ndarray,
                    gravity: np.ndarray) -> np.ndarray:
    """(N, 7) joint torques of a point mass's weight at `offset_m` in the hand's frame, from
    (N, 9) hand rotations and (N, 6, 7) hand Jacobians: J_p^T m g, J_p = J_v - [R r]x J_w;
    `gravity` the model's (model.opt.gravity, m/s^2)."""
    arm = rotation.reshape(-1, 3, 3) @ offset_m  # (N, 3) the point from the hand's origin, world
    force = mass_kg * np.asarray(gravity, dtype=float)
    return (np.einsum("nij,i->nj", jacobian[:, :3], force)
            + np.einsum("nij,ni->nj", jacobian[:, 3:], np.cross(arm, force)))


def attach_payload(model: mujoco.MjModel, weights: ResidualWeights) -> None:
    """The residual's point mass added to the hand body's inertia in `model`, once: a model
    whose hand already has it is left as it is; one whose hand is neither the mass the
    residual was fit on nor that plus the point mass is refused (another robot)."""
    mass = weights.payload_mass_kg
    if mass <= 0.0:
        return
    hand = model.body(HAND_BODY).id
    fitted_on = float(weights.payload[4])
    now = float(model.body_mass[hand])
    if abs(now - (fitted_on + mass)) <= _MASS_MATCH_KG:
        return
    if abs(now - fitted_on) > _MASS_MATCH_KG:
        raise ResidualError(f"the residual was fit on a hand of {fitted_on:.4f} kg; this model's {HAND_BODY} has "
                            f"{now:.4f} kg: a residual belongs to the twin version it was built with")
    # the combined inertia about the new centre of mass, in the body's frame, then its principal axes
    w, x, y, z = model.body_iquat[hand]
    axes = np.zeros(9)
    mujoco.mju_quat2Mat(axes, np.array([w, x, y, z]))
    axes = axes.reshape(3, 3)
    own_centre, point = model.body_ipos[hand].copy(), np.asarray(weights.payload_offset_m, dtype=float)
    centre = (now * own_centre + mass * point) / (now + mass)

    def shifted(m: float, d: np.ndarray) -> np.ndarray:
        return m * (float(d @ d) * np.eye(3) - np.outer(d, d))
    inertia = (axes @ np.diag(model.body_inertia[hand]) @ axes.T + shifted(now, own_centre - centre)
               + shifted(mass, point - centre))
    principal, vectors = np.linalg.eigh(inertia)
    if np.linalg.det(vectors) < 0:
        vectors[:, 0] = -vectors[:, 0]
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, vectors.ravel())
    model.body_mass[hand] = now + mass
    model.body_ipos[hand] = centre
    model.body_iquat[hand] = quat
    model.body_inertia[hand] = principal
    mujoco.mj_setConst(model, mujoco.MjData(model))


class ResidualTorque:
    """The residual of one twin on one compiled model; `apply(data)` before each step. The
    point mass, where the residual has one, is added to `model` itself (attach_payload):
    whatever steps that model integrates its inertia."""

    def __init__(self, model: mujoco.MjModel, weights: ResidualWeights) -> None:
        self.model, self.weights = model, weights
        attach_payload(model, weights)
        self._qpos = joint_qpos_addresses(model, ARM_JOINTS)
        self._dof = joint_dof_addresses(model, ARM_JOINTS)
        self._actuators = command_actuator_ids(model, ARM_JOINTS)
        self._hand = model.body(HAND_BODY).id

    def torques(self, rotation: np.ndarray, jacobian: np.ndarray, velocity: np.ndarray,
                error: np.ndarray) -> np.ndarray:
        """(N, 7) joint torques from (N, 9) hand rotations (row-major), (N, 6, 7) hand
        Jacobians (translation rows, then rotation), (N, 7) velocities and position errors:
        the networks' (masked) and the point mass's weight."""
        w = self.weights
        wrench = _mlp(w.wrench, rotation)
        local = _mlp(w.joint, transmission_inputs(velocity, error, w.velocity_scale, w.error_scale,
                                                  w.fine_ratio))[..., 0]
        networks = (np.einsum("nij,ni->nj", jacobian, wrench) + local) * w.mask
        if w.payload_mass_kg <= 0.0:
            return networks
        return networks + payload_torques(w.payload_mass_kg, w.payload_offset_m, rotation, jacobian,
                                          self.model.opt.gravity)

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
