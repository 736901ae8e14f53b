"""The residual stage: a learned joint-torque residual for what identification cannot express.

Pure Python (numpy, scipy, MuJoCo, torch; no rclpy). Run after identification on the
identified twin's compiled model and the fit recordings that excite the arm alone (no box
moved: contact forces are not a function of the arm's state). Steps:

1. Labels. At every recorded state the torque the twin lacks is M(q) (a_measured - a_twin):
   a_measured is the Savitzky-Golay derivative of the measured joint velocities, a_twin the
   twin's acceleration at the measured state under the commands then in force (the twin's
   own delay), smoothed by the same filter so both see the same window.
2. Noise floor. The joint position sensors' noise, estimated from the recordings' second
   differences (median absolute deviation; a smooth motion's second difference at 500 Hz is
   far below it). A twin whose open-loop error on the validation part is within
   `SYSTEMATIC_FACTOR` of it has no systematic error left: no residual is trained.
3. A load on the hand (`fit_payload`): the rigid-body regressor of a load (Newton-Euler,
   linear in its 10 inertial parameters) fitted to the labels by least squares, refined as
   a point mass (scipy); one of `PAYLOAD_MIN_KG`-`PAYLOAD_MAX_KG` is kept as the residual's
   load and taken out of the labels (the build then identifies the arm again with it:
   twinloop_builder.build, `stop_at_load`).
4. Training of the networks (torch, Adam with a cosine schedule, seeded) on the first part of each
   recording; the loss is the torque error over each joint's position gain, i.e. in the
   radians it would offset a joint at rest, so a light wrist joint counts as much as the
   shoulder.
5. Validation on the recordings' last `VALIDATION_FRACTION`: open-loop replays from the
   recorded state with and without the residual. A joint the networks do not improve is masked;
   the residual is kept when it lowers the whole error by `MIN_IMPROVEMENT` or more.
The residual's form is twinloop_twin.residual's (the load; a hand wrench through the
Jacobian plus a per-joint transmission torque). No library fits a torque residual to a
MuJoCo model's recordings; torch does the learning, scipy the filtering and the load's
refinement (MuJoCo's own sysid identifies the schema's parameters, not a load the schema
lacks).
"""
from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import mujoco
import numpy as np
from scipy.signal import savgol_filter

from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS, COMMANDED_JOINTS
from twinloop_twin.residual import HAND_BODY, ResidualTorque, ResidualWeights, transmission_inputs
from twinloop_twin.scene import (command_actuator_ids, command_delay_of, fill_command_history, joint_dof_addresses,
                                 joint_qpos_addresses, reset_to_home)

from twinloop_builder.recording import RecordedMotion

MODES = ("auto", "off")
HIDDEN = 32  # units per hidden layer of each part
ITERATIONS = 4000  # Adam steps, minibatches of BATCH samples
BATCH = 512
LEARNING_RATE = 3e-3
# the transmission part's fine inputs resolve 1/FINE_RATIO of each input's spread (twinloop_twin.residual;
# on 2 mrad of backlash on joint 4, 20, 50, 100 and 200 all took its held-out error from 0.36 to 0.22-0.23 mrad;
# without them, the network learned a ramp through the dead zone and the residual was not kept)
FINE_RATIO = 100.0
SMOOTHING_WINDOW = 11  # samples (22 ms at 500 Hz) of the Savitzky-Golay filter, order 2
VALIDATION_FRACTION = 0.25
MIN_IMPROVEMENT = 0.1  # the residual is kept when it lowers the validation error by 10 % or more
SYSTEMATIC_FACTOR = 2.0  # an error above this many times the noise floor is systematic
SEED = 0
PAYLOAD_MIN_KG = 0.02  # kg: a load found lighter than this is taken as none
PAYLOAD_MAX_KG = 5.0  # kg: one heavier is not a load the fit can have found (the Panda carries 3 kg)
PAYLOAD_MAX_OFFSET_M = 0.3  # m: a centre farther from the hand is no load on it
# a load a version carries on that the recordings put this fraction of its mass, and at least
# LOAD_CHANGE_MIN_KG, lighter or heavier is not on the cell as it was (load_difference; on a
# cell that still carries its 0.47 kg load the check read -0.043 kg, with it taken off -0.453)
LOAD_CHANGE_FRACTION = 0.25
LOAD_CHANGE_MIN_KG = 0.1
_ARM_COLUMNS = [ALL_JOINTS.index(j) for j in ARM_JOINTS]
_ARM_COMMANDS = [COMMANDED_JOINTS.index(j) for j in ARM_JOINTS]


@dataclass
class ResidualOutcome:
    """What the stage decided and measured (rad for the errors)."""

    weights: ResidualWeights | None  # None: no residual (see `reason`)
    reason: str
    noise_floor_rad: float = float("nan")
    validation_before_rad: float = float("nan")
    validation_after_rad: float = float("nan")
    validation_per_joint: dict[str, tuple[float, float]] = field(default_factory=dict)
    held_out_before_rad: float = float("nan")
    held_out_after_rad: float = float("nan")
    held_out_per_joint: dict[str, tuple[float, float]] = field(default_factory=dict)
    samples: int = 0
    train_s: float = 0.0
    # a load on the hand the labels showed (mass kg, offset m in the hand's frame), found or not kept
    load: tuple[float, np.ndarray] | None = None
    load_note: dict = field(default_factory=dict)  # how the build used it (the report's `load`)

    def report(self) -> dict:
        def mrad(value: float):
            return None if not np.isfinite(value) else round(value * 1e3, 4)
        out = {"applied": self.weights is not None, "reason": self.reason, "samples": self.samples,
               "train_s": round(self.train_s, 1), "noise_floor_mrad": mrad(self.noise_floor_rad),
               "validation_rmse_mrad": {"without": mrad(self.validation_before_rad),
                                        "with": mrad(self.validation_after_rad)},
               "held_out_rmse_mrad": {"without": mrad(self.held_out_before_rad),
                                      "with": mrad(self.held_out_after_rad)}}
        if self.weights is not None:
            out["masked_joints"] = [j for j, m in zip(ARM_JOINTS, self.weights.mask) if m == 0.0]
        if self.load is not None:
            out["load"] = {"mass_kg": round(self.load[0], 4), "offset_m": [round(float(v), 4) for v in self.load[1]],
                           **self.load_note}
        return out


def noise_floor(recordings: Sequence[RecordedMotion]) -> float:
    """The arm's joint position noise (rad, one standard deviation), pooled over joints:
    1.4826 MAD of the second difference over sqrt(6) (white noise's second difference has
    six times its variance)."""
    spreads = []
    for recording in recordings:
        second = np.diff(recording.position[:, _ARM_COLUMNS], n=2, axis=0)
        spreads.append(1.4826 * np.median(np.abs(second - np.median(second, axis=0)), axis=0) / np.sqrt(6.0))
    return float(np.sqrt(np.mean(np.square(np.concatenate(spreads))))) if spreads else float("nan")


class TwinModel:
    """The identified model, with a copy whose actuators read ctrl undelayed (labels set the
    delayed command themselves)."""

    def __init__(self, model: mujoco.MjModel) -> None:
        self.model = model
        self.undelayed = copy.copy(model)
        self.undelayed.actuator_delay[:] = 0.0
        self.delay_s = command_delay_of(float(model.actuator_delay[command_actuator_ids(model, ARM_JOINTS[:1])[0]]),
                                        model.opt.timestep)
        self.all_q = joint_qpos_addresses(model, ALL_JOINTS)
        self.all_v = joint_dof_addresses(model, ALL_JOINTS)
        self.arm_q = joint_qpos_addresses(model, ARM_JOINTS)
        self.arm_v = joint_dof_addresses(model, ARM_JOINTS)
        self.actuators = command_actuator_ids(model, COMMANDED_JOINTS)


def labels(twin: TwinModel, recording: RecordedMotion, window: int = SMOOTHING_WINDOW):
    """(rotation (N, 9), Jacobian (N, 6, 7), velocity (N, 7), error (N, 7), torque (N, 7),
    motion (N, 9): the hand's angular velocity, linear and angular acceleration, world) at
    the recording's states, the filter's half window trimmed at both ends."""
    model = twin.undelayed
    data = mujoco.MjData(model)
    reset_to_home(model, data)
    times = recording.state_t
    commands = recording.commands_on_grid(times - twin.delay_s)
    n = len(times)
    hand = model.body("panda_hand").id
    rotation, jacobian = np.zeros((n, 9)), np.zeros((n, 6, 7))
    twin_acc, inertia = np.zeros((n, 7)), np.zeros((n, 7, 7))
    full_jac, full_m = np.zeros((6, model.nv)), np.zeros((model.nv, model.nv))
    for k in range(n):
        data.qpos[twin.all_q] = recording.position[k]
        data.qvel[:] = 0.0
        data.qvel[twin.all_v] = recording.velocity[k]
        data.ctrl[twin.actuators] = commands[k]
        mujoco.mj_forward(model, data)
        twin_acc[k] = data.qacc[twin.arm_v]
        mujoco.mj_fullM(model, data, full_m)
        inertia[k] = full_m[np.ix_(twin.arm_v, twin.arm_v)]
        mujoco.mj_jacBody(model, data, full_jac[:3], full_jac[3:], hand)
        jacobian[k] = full_jac[:, twin.arm_v]
        rotation[k] = data.xmat[hand]
    dt = float(np.median(np.diff(times)))
    measured_acc = savgol_filter(recording.velocity[:, _ARM_COLUMNS], window, 2, deriv=1, delta=dt, axis=0)
    torque = np.einsum("kij,kj->ki", inertia, measured_acc - savgol_filter(twin_acc, window, 2, axis=0))
    velocity = recording.velocity[:, _ARM_COLUMNS]
    error = commands[:, _ARM_COMMANDS] - recording.position[:, _ARM_COLUMNS]
    # the hand's motion, for a point mass on it: twist from the Jacobian, its derivative
    # through the same filter as the joints' accelerations
    twist = np.einsum("kij,kj->ki", jacobian, velocity)
    twist_rate = savgol_filter(twist, window, 2, deriv=1, delta=dt, axis=0)
    motion = np.concatenate([savgol_filter(twist[:, 3:], window, 2, axis=0), twist_rate[:, :3], twist_rate[:, 3:]],
                            axis=1)
    keep = slice(window // 2, n - window // 2)
    return rotation[keep], jacobian[keep], velocity[keep], error[keep], torque[keep], motion[keep]


def train(rotation, jacobian, velocity, error, torque, gains: np.ndarray, *, iterations: int = ITERATIONS,
          seed: int = SEED) -> ResidualWeights:
    """Fit the two networks (twinloop_twin.residual) to the torque labels."""
    import torch

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    velocity_scale = velocity.std(axis=0) + 1e-6
    error_scale = error.std(axis=0) + 1e-6

    def mlp(inputs: int, outputs: int) -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(inputs, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                                   torch.nn.Tanh(), torch.nn.Linear(HIDDEN, outputs)).double()

    inputs = transmission_inputs(velocity, error, velocity_scale, error_scale, FINE_RATIO)
    wrench_net, joint_net = mlp(9, 6), mlp(inputs.shape[2], 1)
    t = {name: torch.tensor(np.asarray(a, dtype=float)) for name, a in
         (("rotation", rotation), ("jacobian", jacobian), ("torque", torque))}
    local = torch.tensor(inputs)
    unit = torch.tensor(gains * 1e-4)  # N*m per 0.1 mrad of each joint's position error

    def predict(index):
        wrench = wrench_net(t["rotation"][index])
        return torch.einsum("bij,bi->bj", t["jacobian"][index], wrench) + joint_net(local[index])[..., 0]

    parameters = list(wrench_net.parameters()) + list(joint_net.parameters())
    optimizer = torch.optim.Adam(parameters, lr=LEARNING_RATE)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, iterations)
    for _ in range(iterations):
        index = torch.randint(0, len(local), (min(BATCH, len(local)),), generator=generator)
        loss = (((predict(index) - t["torque"][index]) / unit) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()

    def arrays(net: torch.nn.Sequential) -> tuple[np.ndarray, ...]:
        return tuple(p.detach().numpy().copy() for p in net.parameters())
    return ResidualWeights(arrays(wrench_net), arrays(joint_net), velocity_scale, error_scale, np.ones(7),
                           fine_ratio=FINE_RATIO)


def _cross(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.cross(a, b, axis=-1)


def _to_joints(jacobian: np.ndarray, force: np.ndarray, moment: np.ndarray) -> np.ndarray:
    """(N, 7) joint torques of a force and a moment (N, 3, world) on the hand at its origin."""
    return np.einsum("nij,ni->nj", jacobian[:, :3], force) + np.einsum("nij,ni->nj", jacobian[:, 3:], moment)


def payload_regressor(rotation: np.ndarray, jacobian: np.ndarray, motion: np.ndarray,
                      gravity: np.ndarray) -> np.ndarray:
    """(N, 7, 10): the joint torques a rigid load on the hand exerts are Y @ theta, linear in
    its inertial parameters theta = (m, m c (3), I_o (xx yy zz xy xz yz)) in the hand's frame,
    c its centre of mass and I_o its inertia about the hand's origin (the Newton-Euler
    equations of the load: -F = m (g - a) - alpha x h - w x (w x h), -N = h x (g - a) -
    I alpha - w x (I w), with h = R m c and I = R I_o R^T in the world; g: `gravity`, the
    model's)."""
    n = len(rotation)
    axes = rotation.reshape(n, 3, 3)
    w, linear, angular = motion[:, :3], motion[:, 3:6], motion[:, 6:]
    free = np.asarray(gravity, dtype=float) - linear  # g - a
    zero = np.zeros((n, 3))
    columns = [_to_joints(jacobian, free, zero)]
    for i in range(3):
        h = axes[:, :, i]
        columns.append(_to_joints(jacobian, -_cross(angular, h) - _cross(w, _cross(w, h)), _cross(h, free)))
    for a, b in ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2)):
        unit = np.zeros((3, 3))
        unit[a, b] = unit[b, a] = 1.0
        inertia = axes @ unit @ axes.transpose(0, 2, 1)
        moment = -np.einsum("nij,nj->ni", inertia, angular) - _cross(w, np.einsum("nij,nj->ni", inertia, w))
        columns.append(_to_joints(jacobian, zero, moment))
    return np.stack(columns, axis=2)


def point_mass_torques(mass_kg: float, offset_m: np.ndarray, rotation: np.ndarray, jacobian: np.ndarray,
                       motion: np.ndarray, gravity: np.ndarray) -> np.ndarray:
    """(N, 7) joint torques a point mass at `offset_m` (the hand's frame) exerts on the arm."""
    c = np.asarray(offset_m, dtype=float)
    theta = np.array([mass_kg, *(mass_kg * c), *_point_inertia(mass_kg, c)])
    return payload_regressor(rotation, jacobian, motion, gravity) @ theta


def _point_inertia(mass_kg: float, c: np.ndarray) -> np.ndarray:
    """A point mass's inertia about the origin, (xx yy zz xy xz yz)."""
    full = mass_kg * (float(c @ c) * np.eye(3) - np.outer(c, c))
    return np.array([full[0, 0], full[1, 1], full[2, 2], full[0, 1], full[0, 2], full[1, 2]])


def with_the_load(first: ResidualOutcome, second: ResidualOutcome | None, hand_mass_kg: float,
                  reason: str = "") -> ResidualOutcome | None:
    """The residual that carries the load `first` found (stop_at_load), where the arm
    identified again with that load in its model predicts the validation part at least
    MIN_IMPROVEMENT better than the first identification did; `second` is the networks'
    outcome beside the load on that arm (fit_residual(find_load=False)). None where the
    load is not kept: the caller learns the networks alone on the first identification.
    `hand_mass_kg`: the hand body's own mass in the model without the load (the residual
    file keeps it, attach_payload checks it)."""
    if first.load is None:
        raise ValueError("with_the_load: the first outcome found no load")
    if second is None or not second.validation_before_rad <= (1.0 - MIN_IMPROVEMENT) * first.validation_before_rad:
        return None
    return carrying_load(second, first.load, hand_mass_kg, reason)


def carrying_load(outcome: ResidualOutcome, load: tuple[float, Sequence[float]], hand_mass_kg: float,
                  reason: str = "") -> ResidualOutcome:
    """`outcome` whose residual carries a load on the hand (mass kg, offset m in the hand's
    frame): beside its networks, or alone (ResidualWeights.load_only) where it has none.
    `hand_mass_kg`: the hand body's own mass in the model without the load."""
    mass, offset = load
    payload = np.array([mass, *offset, hand_mass_kg])
    weights = (ResidualWeights.load_only(payload) if outcome.weights is None
               else dataclasses.replace(outcome.weights, payload=payload))
    return dataclasses.replace(outcome, weights=weights, load=(mass, np.asarray(offset, dtype=float)),
                               reason=reason or outcome.reason)


def load_difference(model: mujoco.MjModel, recordings: Sequence[RecordedMotion]) -> float:
    """The mass (kg, signed) on the hand that the recordings' torque labels show beyond what
    `model` has there: the mass of the linear least-squares load (fit_payload's first step,
    not bounded). About 0 where the model's hand load is the cell's; about minus its mass
    where the model has a load the cell no longer carries. NaN without recordings."""
    if not recordings:
        return float("nan")
    twin = TwinModel(model)
    parts = [labels(twin, r) for r in recordings]
    rotation, jacobian, _, _, torque, motion = (np.concatenate([p[i] for p in parts]) for i in range(6))
    gains = model.actuator_gainprm[command_actuator_ids(model, ARM_JOINTS), 0]
    _, _, theta = _linear_load(rotation, jacobian, torque, motion, gains, model.opt.gravity)
    return float(theta[0])


def load_changed(carried_kg: float, difference_kg: float) -> bool:
    """Whether a carried load of `carried_kg` is not on the cell as it was, given the
    recordings' `difference_kg` (load_difference)."""
    return abs(difference_kg) >= max(LOAD_CHANGE_MIN_KG, LOAD_CHANGE_FRACTION * carried_kg)


def _linear_load(rotation, jacobian, torque, motion, gains: np.ndarray,
                 gravity: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(regressor, target, theta): a load's 10 inertial parameters theta by linear least
    squares on the torque labels, each joint's row over its gain (as the networks' loss)."""
    regressor = (payload_regressor(rotation, jacobian, motion, gravity) / gains[None, :, None]).reshape(-1, 10)
    target = (torque / gains[None, :]).ravel()
    theta, *_ = np.linalg.lstsq(regressor, target, rcond=None)
    return regressor, target, theta


def fit_payload(rotation, jacobian, torque, motion, gains: np.ndarray,
                gravity: np.ndarray) -> tuple[float, np.ndarray] | None:
    """A load on the hand the description lacks, from the torque labels: the inertial
    parameters by linear least squares (the torque errors over each joint's gain, as the
    networks' loss), then refined as a point mass (scipy least_squares from there; mass,
    offset in the hand's frame). None when
    the fit finds no load: a mass under PAYLOAD_MIN_KG or over PAYLOAD_MAX_KG, or a centre
    farther than PAYLOAD_MAX_OFFSET_M from the hand."""
    from scipy.optimize import least_squares

    regressor, target, theta = _linear_load(rotation, jacobian, torque, motion, gains, gravity)
    mass = float(theta[0])
    if not (PAYLOAD_MIN_KG <= mass <= PAYLOAD_MAX_KG):
        return None
    # then as a point mass (its inertia follows from its mass and place): the free inertia of
    # the linear fit trades off with the centre along the hand's axis
    def misfit(x: np.ndarray) -> np.ndarray:
        return regressor @ np.array([x[0], *(x[0] * x[1:]), *_point_inertia(x[0], x[1:])]) - target
    refined = least_squares(misfit, np.array([mass, *(theta[1:4] / mass)]), x_scale=[0.1, 0.05, 0.05, 0.05])
    mass, centre = float(refined.x[0]), refined.x[1:]
    if not (PAYLOAD_MIN_KG <= mass <= PAYLOAD_MAX_KG):
        return None
    if np.linalg.norm(centre) > PAYLOAD_MAX_OFFSET_M:
        return None
    return mass, centre


def replay_errors(twin: TwinModel, recording: RecordedMotion, residual: ResidualTorque | None,
                  start_s: float | None = None) -> np.ndarray:
    """(N, 7) arm position errors of an open-loop replay from the recorded state at `start_s`
    (default: the first), the recorded commands applied when they took effect."""
    model = twin.model if residual is None else residual.model  # (its point mass is in its model)
    data = mujoco.MjData(model)
    reset_to_home(model, data)
    first = 0 if start_s is None else int(np.searchsorted(recording.state_t, start_s))
    times = recording.state_t[first:]
    commands = recording.commands_on_grid(times)
    # the delay buffer holds what was commanded over the last delay before the start
    data.qpos[twin.all_q] = recording.position[first]
    data.qvel[twin.all_v] = recording.velocity[first]
    data.ctrl[twin.actuators] = recording.commands_on_grid(times[:1] - twin.delay_s)[0]
    data.time = float(times[0])
    fill_command_history(model, data)
    mujoco.mj_forward(model, data)
    dt = model.opt.timestep
    positions = [data.qpos[twin.arm_q].copy()]
    for k in range(1, len(times)):
        data.ctrl[twin.actuators] = commands[k - 1]
        steps = max(1, int(round((times[k] - data.time) / dt)))
        if residual is not None:
            residual.step(data, steps)
        else:
            mujoco.mj_step(model, data, nstep=steps)
        positions.append(data.qpos[twin.arm_q].copy())
    return np.array(positions) - recording.position[first:, _ARM_COLUMNS]


def _on_a_copy(model: mujoco.MjModel, weights: ResidualWeights) -> ResidualTorque:
    """The residual on a copy of the identified model (its point mass goes into the model it
    is given; the identified one stays as identified)."""
    return ResidualTorque(copy.copy(model), weights)


def rmse(errors: list[np.ndarray]) -> tuple[float, np.ndarray]:
    stacked = np.vstack(errors)
    return float(np.sqrt(np.mean(stacked ** 2))), np.sqrt(np.mean(stacked ** 2, axis=0))


def fit_residual(model: mujoco.MjModel, recordings: Sequence[RecordedMotion],
                 held_out: Sequence[RecordedMotion] = (), *, mode: str = "auto", iterations: int = ITERATIONS,
                 find_load: bool = True, stop_at_load: bool = False,
                 progress: Callable[[float, str], None] = lambda *_: None) -> ResidualOutcome:
    """Train, validate and decide on a residual for the identified `model` (see the module
    docstring); `recordings`: fit recordings without box motion. `find_load`: look for a
    load on the hand first (off where the model has the load already); `stop_at_load`: when
    one is found, return then (`load` set, no networks: the caller identifies the arm again
    with it and runs the stage once more)."""
    if mode not in MODES:
        raise ValueError(f"residual mode {mode!r}: use one of {list(MODES)}")
    if mode == "off":
        return ResidualOutcome(None, "residual: off in the settings")
    if not recordings:
        return ResidualOutcome(None, "no fit recording moved the arm alone (a residual needs one without box motion)")
    twin = TwinModel(model)
    floor = noise_floor(recordings)
    cuts = [float(r.state_t[0] + (1.0 - VALIDATION_FRACTION) * r.duration_s) for r in recordings]
    progress(0.05, "residual: validation error of the identified twin")
    before = [replay_errors(twin, r, None, cut) for r, cut in zip(recordings, cuts)]
    before_rmse, before_joint = rmse(before)
    outcome = ResidualOutcome(None, "", noise_floor_rad=floor, validation_before_rad=before_rmse)
    if before_rmse <= SYSTEMATIC_FACTOR * floor:
        outcome.reason = (f"no systematic error left: validation RMSE {before_rmse * 1e3:.3f} mrad is within "
                          f"{SYSTEMATIC_FACTOR:g}x the noise floor {floor * 1e3:.3f} mrad")
        return outcome
    progress(0.15, "residual: labels from the fit recordings")
    parts = [labels(twin, r.window(r.state_t[0], cut)) for r, cut in zip(recordings, cuts)]
    data = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    outcome.samples = len(data[0])
    progress(0.25, f"residual: training on {outcome.samples} samples")
    started = time.monotonic()
    gains = model.actuator_gainprm[command_actuator_ids(model, ARM_JOINTS), 0]
    rotation, jacobian, velocity, error, torque, motion = data
    payload = fit_payload(rotation, jacobian, torque, motion, gains, model.opt.gravity) if find_load else None
    outcome.load = payload
    if payload is not None and stop_at_load:
        outcome.reason = f"a load on the hand: {payload[0]:.3f} kg at {np.round(payload[1], 3).tolist()} m"
        return outcome
    if payload is not None:  # the networks learn what the load leaves
        torque = torque - point_mass_torques(*payload, rotation, jacobian, motion, model.opt.gravity)
        progress(0.3, f"residual: a load on the hand the description lacks: {payload[0]:.3f} kg at "
                      f"{np.round(payload[1], 3).tolist()} m (the hand's frame)")
    weights = train(rotation, jacobian, velocity, error, torque, gains, iterations=iterations)
    if payload is not None:
        weights = dataclasses.replace(weights, payload=np.array(
            [payload[0], *payload[1], float(model.body_mass[model.body(HAND_BODY).id])]))
    outcome.train_s = time.monotonic() - started
    progress(0.8, "residual: validation with the residual")
    after = [replay_errors(twin, r, _on_a_copy(model, weights), cut) for r, cut in zip(recordings, cuts)]
    _, after_joint = rmse(after)
    mask = (after_joint < before_joint).astype(float)
    weights = dataclasses.replace(weights, mask=mask)
    if mask.any() and not mask.all():
        after = [replay_errors(twin, r, _on_a_copy(model, weights), cut) for r, cut in zip(recordings, cuts)]
    after_rmse, after_joint = rmse(after) if mask.any() else (before_rmse, before_joint)
    outcome.validation_after_rad = after_rmse
    outcome.validation_per_joint = {j: (float(b), float(a)) for j, b, a in zip(ARM_JOINTS, before_joint, after_joint)}
    if after_rmse > (1.0 - MIN_IMPROVEMENT) * before_rmse:
        outcome.reason = (f"not kept: validation RMSE {before_rmse * 1e3:.3f} -> {after_rmse * 1e3:.3f} mrad, less "
                          f"than the {MIN_IMPROVEMENT:.0%} improvement asked for")
        return outcome
    outcome.weights = weights
    outcome.reason = (f"kept: validation RMSE {before_rmse * 1e3:.3f} -> {after_rmse * 1e3:.3f} mrad (noise floor "
                      f"{floor * 1e3:.3f}); masked joints: "
                      f"{[j for j, m in zip(ARM_JOINTS, mask) if m == 0.0] or 'none'}")
    if held_out:
        progress(0.9, "residual: held-out recordings with and without it")
        plain = rmse([replay_errors(twin, r, None) for r in held_out])
        corrected = rmse([replay_errors(twin, r, _on_a_copy(model, weights)) for r in held_out])
        outcome.held_out_before_rad, outcome.held_out_after_rad = plain[0], corrected[0]
        outcome.held_out_per_joint = {j: (float(b), float(a)) for j, b, a in zip(ARM_JOINTS, plain[1], corrected[1])}
    return outcome
