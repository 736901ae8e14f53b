"""Physics identification of the workcell with MuJoCo's own `mujoco.sysid`. Pure Python.

What is identified (names of twinloop_twin.model_parameters):
  joint.<j>.friction_loss|damping|armature, actuator.<j>.kp|kv   (arm stage: joint excitation)
  command.delay_s                                                (arm stage)
  box.mass_kg, box.friction, finger.friction                     (push stage, arm fixed)

How: recordings become `sysid.ModelSequences` (control = the recorded commands on the
physics grid, measured = joint positions, joint efforts and the box pose); `sysid.optimize`
(MuJoCo's Levenberg-Marquardt, `mujoco.minimize`) fits the parameters; the covariance comes
from `sysid.calculate_intervals` at the optimum.

Where we extend or wrap mujoco.sysid, and why:
- build_model: sysid recompiles the MjSpec for every candidate; we write candidates into a
  copy of one compiled model with twinloop_twin.model_parameters.apply_parameters (the same
  code that serves twins), which is what the sim bridge does too and is ~20x cheaper.
- rollout: sysid's default rollout keeps the full physics state of every step; with the
  100-sample command-delay history in the state that is 1648 doubles per step (GBs for a
  30 s recording x 40 finite-difference columns). `_blocked_rollout` runs the same
  mujoco.rollout in blocks and keeps only the sensor outputs.
- residual: sysid's default divides each signal by its norm (so a joint's weight depends on
  its absolute offset); `_weighted_residual` weights by the sensor noise instead, so the
  residual is in units of noise and the covariance is meaningful.
- command delay: with zero-order hold the delay acts in whole physics steps, a staircase
  a finite-difference Jacobian cannot follow. The identification model reads the delayed
  command with linear interpolation (identical at whole steps, continuous between), the
  delay is bounded below by one step (any delay in (0, dt] acts as dt) and the fit starts
  from a servo-law estimate (linear least squares of the efforts per candidate delay), so it
  cannot slide into delay -> 0 nor absorb a gain error. The final fit holds the delay at the
  whole step that fits best under zero-order hold, as the workcell and the twin's scene act.
- confidence intervals: calculate_intervals assumes white residuals; recorded residuals are
  correlated in time (command timing quantization), so the covariance is inflated by the
  residuals' integrated autocorrelation time (a Newey-West style correction).
- push stage: with contacts the residual is chaotic in the parameters (measured: a 0.2 %
  change of the box mass moves the cost by up to 1.9x, in both directions), so a
  finite-difference Jacobian is noise and Levenberg-Marquardt stalls in whichever dip is
  near (three starts ended 6-30 % off). The push stage minimizes the same sysid residual
  with scipy's Nelder-Mead instead, and takes its uncertainty from a quadratic response
  surface of the cost sampled around the optimum: the scatter of the cost about that
  trend is the objective's noise, and a parameter set is as good as the optimum while the
  trend rises by less than it. Directions where the trend does not rise by that much over
  the sampled region (typically mass against box friction: slow pushes feel only the
  sliding force m*mu*g) are reported as not identifiable, with the product when it is.
- identifiability: parameters of a joint that never moved are not fitted at all; others are
  flagged when their relative std exceeds a threshold, with guidance from the correlation
  matrix (which parameter each is confounded with) and from what excites each quantity.
"""
from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import math
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import mujoco
import mujoco.rollout as mj_rollout
import numpy as np
from mujoco import minimize as mj_minimize
from mujoco import sysid

from twinloop_twin.model_parameters import apply_parameters
from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS, COMMANDED_JOINTS, FINGER_JOINTS
from twinloop_twin.scene import command_actuator_ids, fill_command_history

from twinloop_builder.recording import Recording

JOINT_QUANTITIES = ("friction_loss", "damping", "armature")
GAIN_QUANTITIES = ("kp", "kv")
BOX_PARAMETERS = ("box.mass_kg", "box.friction", "finger.friction")
DELAY = "command.delay_s"
BOX_BODY = "box"
DELAY_UNIT_S = 0.01  # the delay is optimized in units of 10 ms, so every variable is O(1)


class IdentificationError(ValueError):
    """Identification cannot run on the given data; the message says what to record."""

    code = "DEGENERATE_DATA"


class IdentificationCancelled(RuntimeError):
    pass


@dataclass(frozen=True)
class IdentificationSettings:
    position_std_rad: float = 1e-4  # weight of joint position residuals (≈ encoder noise)
    effort_std_nm: float = 0.1  # weight of joint effort residuals (≈ torque sensor noise)
    box_position_std_m: float = 1e-3  # weight of box position residuals (≈ perception noise)
    push_effort_std_nm: float = 1.0  # weight of efforts while pushing (contact makes them spiky)
    max_iterations: int = 12
    confidence: float = 0.95  # level of the reported confidence intervals
    min_motion_rad: float = 0.05  # a joint whose travel is below this is "never moved"
    min_finger_motion_m: float = 0.004
    max_relative_std: float = 0.1  # identifiable when std <= this fraction of the value
    max_residual_rms: float = 8.0  # residual rms (noise units) above which a stage's fit is not trusted
    multiplier_bounds: tuple[float, float] = (0.2, 5.0)  # search range, x the prior value
    delay_bounds_s: tuple[float, float] = (0.001, 0.09)
    # Finite-difference step (relative in the log-parametrization). 1e-5 was within the
    # simulation's numerical noise for small-inertia parameters: the Jacobian column of joint
    # 5's armature was noise, Levenberg-Marquardt stopped 2.5 % off (14 sigma) with a lower
    # cost at the truth, and gains came out 5 sigma off; 1e-3 fixed both on the same bags.
    fd_step: float = 1e-3
    xtol: float = 1e-6  # stop when the step is below this, relative to |x| (log-multipliers)
    fresh_jacobian: bool = False  # recompute the Jacobian at the optimum (else: the last iteration's)
    block_steps: int = 100  # rollout block length (memory bound)
    min_duration_s: float = 5.0
    push_margin_s: tuple[float, float] = (0.4, 0.8)  # s before / after the box moves
    box_speed_threshold_m_s: float = 0.01
    push_max_evaluations: int = 150  # Nelder-Mead budget of the push stage (~0.1 s per evaluation and push)
    push_surface_samples: int = 40  # cost samples of the push stage's response surface
    push_surface_radius: float = 0.1  # half-width of the sampled region, in log-multipliers (~ +-10 %)
    threads: int = 0  # 0: os.cpu_count()
    delay_stage_iterations: int = 8  # iterations of the continuous-delay stage (the final stage refines)


@dataclass(frozen=True)
class Estimate:
    name: str
    mean: float
    std: float
    ci_low: float
    ci_high: float
    prior: float
    identifiable: bool
    note: str = ""


@dataclass
class StageReport:
    name: str
    parameters: list[str]
    recordings: list[str]
    iterations: int
    residual_evaluations: int
    cost_before: float
    cost_after: float
    autocorrelation_inflation: float
    wall_s: float
    residual_rms: float = float("nan")  # in units of the assumed sensor noise (≈ 1 when the model explains the data)


@dataclass
class IdentificationResult:
    estimates: dict[str, Estimate]
    stages: list[StageReport]
    guidance: list[str]
    correlations: dict[tuple[str, str], float]
    held_out_rmse_before_rad: float = float("nan")
    held_out_rmse_after_rad: float = float("nan")
    held_out_per_joint: dict[str, tuple[float, float]] = field(default_factory=dict)
    # combinations the data determines when their parts are not (e.g. box.mass_kg*box.friction)
    derived: dict[str, Estimate] = field(default_factory=dict)

    @property
    def not_identifiable(self) -> list[str]:
        return [n for n, e in self.estimates.items() if not e.identifiable]

    def values(self) -> dict[str, float]:
        return {n: e.mean for n, e in self.estimates.items()}


ProgressFn = Callable[[str, float, str], None]  # (stage, fraction 0..1, message)


# ----------------------------------------------------------------------------- model

def identification_spec(spec: mujoco.MjSpec) -> mujoco.MjSpec:
    """The twin's scene plus the sensors the residual compares: joint positions, joint
    actuator efforts (what /joint_states reports as effort) and the box pose."""
    spec = spec.copy()
    for joint in ALL_JOINTS:
        spec.add_sensor(name=f"{joint}_pos", type=mujoco.mjtSensor.mjSENS_JOINTPOS,
                        objtype=mujoco.mjtObj.mjOBJ_JOINT, objname=joint)
    for joint in ALL_JOINTS:
        spec.add_sensor(name=f"{joint}_effort", type=mujoco.mjtSensor.mjSENS_JOINTACTFRC,
                        objtype=mujoco.mjtObj.mjOBJ_JOINT, objname=joint)
    spec.add_sensor(name="box_pos", type=mujoco.mjtSensor.mjSENS_FRAMEPOS, objtype=mujoco.mjtObj.mjOBJ_BODY,
                    objname=BOX_BODY)
    return spec


N_JOINTS = len(ALL_JOINTS)
POSITION_COLUMNS = slice(0, N_JOINTS)
EFFORT_COLUMNS = slice(N_JOINTS, 2 * N_JOINTS)
BOX_COLUMNS = slice(2 * N_JOINTS, 2 * N_JOINTS + 3)
N_SENSORS = 2 * N_JOINTS + 3


@dataclass(frozen=True)
class FitVariable:
    """One optimizer variable: log multiplier of prior values (tied names share it), or the delay."""

    name: str
    targets: tuple[str, ...]
    priors: tuple[float, ...]

    @property
    def is_delay(self) -> bool:
        return self.name == DELAY

    def x0(self, start: float | None = None) -> float:
        if self.is_delay:
            return (start if start is not None else self.priors[0]) / DELAY_UNIT_S
        return 0.0 if start is None else math.log(start / self.priors[0])

    def physical(self, x: float) -> dict[str, float]:
        if self.is_delay:
            return {DELAY: x * DELAY_UNIT_S}
        return {t: p * math.exp(x) for t, p in zip(self.targets, self.priors)}


class ModelFactory:
    """Compiled candidates: a copy of the base model with the candidate's values applied."""

    def __init__(self, base: mujoco.MjModel, variables: Sequence[FitVariable], fixed: Mapping[str, float],
                 cache_size: int = 96) -> None:
        self.base = base
        self.variables = list(variables)
        self.fixed = dict(fixed)
        self._cache: OrderedDict[bytes, mujoco.MjModel] = OrderedDict()
        self._cache_size = cache_size

    def values(self, x: np.ndarray) -> dict[str, float]:
        values = dict(self.fixed)
        for variable, xi in zip(self.variables, np.ravel(x)):
            values.update(variable.physical(float(xi)))
        return values

    def build(self, x: np.ndarray) -> mujoco.MjModel:
        key = np.asarray(x, dtype=float).tobytes()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        model = copy.copy(self.base)
        apply_parameters(model, self.values(x))
        self._cache[key] = model
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return model


def base_model(spec: mujoco.MjSpec, *, contacts: bool, interpolate_delay: bool = False) -> mujoco.MjModel:
    """The identification model. With `interpolate_delay` the delayed command is read with
    linear interpolation, continuous in the delay (only while the delay is fitted; else
    zero-order hold, exactly as the twin's scene and the workcell act)."""
    model = identification_spec(spec).compile()
    if interpolate_delay:
        model.actuator_history[:, 1] = 1
    if not contacts:
        model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    return model


# ----------------------------------------------------------------------------- data

@dataclass
class Segment:
    """A time window of a recording, as sysid data: initial state, controls, measurements."""

    recording: Recording
    start_s: float
    end_s: float
    initial_state: np.ndarray
    control: sysid.TimeSeries
    measured: sysid.TimeSeries
    weights: np.ndarray  # (N_SENSORS,)


def make_segment(model: mujoco.MjModel, recording: Recording, start_s: float, end_s: float,
                 weights: np.ndarray) -> Segment:
    dt = model.opt.timestep
    i0 = int(np.searchsorted(recording.state_t, start_s))
    t0 = float(recording.state_t[i0])
    steps = int(math.floor((end_s - t0) / dt + 1e-9))
    grid = t0 + dt * np.arange(steps + 1)
    actuators = command_actuator_ids(model, COMMANDED_JOINTS)
    control = np.zeros((steps + 1, model.nu))
    control[:, actuators] = recording.commands_on_grid(grid)
    data = mujoco.MjData(model)
    qpos = model.jnt_qposadr[[model.joint(j).id for j in ALL_JOINTS]]
    dof = model.jnt_dofadr[[model.joint(j).id for j in ALL_JOINTS]]
    box_qpos = model.jnt_qposadr[model.body(BOX_BODY).jntadr[0]]
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    data.qpos[qpos] = recording.position[i0]
    data.qvel[dof] = recording.velocity[i0]
    if len(recording.box_t):
        k = int(np.clip(np.searchsorted(recording.box_t, t0), 0, len(recording.box_t) - 1))
        data.qpos[box_qpos:box_qpos + 7] = recording.box_pose[k]
    data.time = t0
    # The delayed-command buffers hold the commands in force over the last history span.
    data.ctrl[:] = control[0]
    fill_command_history(model, data)
    span = model.actuator_history[0, 0]
    past = t0 - dt * np.arange(span, 0, -1)  # the buffer holds the samples before t0 (as after a reset)
    past_ctrl = recording.commands_on_grid(past)
    for column, actuator in enumerate(actuators):
        mujoco.mj_initCtrlHistory(model, data, int(actuator), past.reshape(-1, 1),
                                  np.ascontiguousarray(past_ctrl[:, column].reshape(-1, 1)))
    mujoco.mj_forward(model, data)
    state = np.empty(mujoco.mj_stateSize(model, mujoco.mjtState.mjSTATE_FULLPHYSICS))
    mujoco.mj_getState(model, data, state, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    keep = (recording.state_t > t0 + 1e-9) & (recording.state_t <= grid[-1] + 1e-9)
    times = recording.state_t[keep]
    measured = np.zeros((len(times), N_SENSORS))
    measured[:, POSITION_COLUMNS] = recording.position[keep]
    measured[:, EFFORT_COLUMNS] = np.nan_to_num(recording.effort[keep])
    w = weights.copy()
    if len(recording.box_t) > 1:
        for axis in range(3):
            measured[:, BOX_COLUMNS.start + axis] = np.interp(times, recording.box_t, recording.box_pose[:, axis])
    else:
        w[BOX_COLUMNS] = 0.0
    return Segment(recording, t0, float(grid[-1]), state,
                   sysid.TimeSeries(grid, control), sysid.TimeSeries(times, measured), w)


def column_weights(settings: IdentificationSettings, *, box: bool) -> np.ndarray:
    w = np.zeros(N_SENSORS)
    w[POSITION_COLUMNS] = 1.0 / settings.position_std_rad
    effort = np.zeros(N_JOINTS)
    for j in COMMANDED_JOINTS:
        effort[ALL_JOINTS.index(j)] = 1.0 / settings.effort_std_nm
    w[EFFORT_COLUMNS] = effort
    if box:
        w[BOX_COLUMNS.start:BOX_COLUMNS.start + 2] = 1.0 / settings.box_position_std_m  # x, y on the table
    return w


# ----------------------------------------------------------------------------- sysid glue

def _blocked_rollout(block_steps: int):
    """A sysid CustomRolloutFn: mujoco.rollout in blocks, keeping only what the residual compares.

    Positions come from the state after each step (what a joint state sample reports),
    efforts from the sensors, which mj_step evaluates at the start of the step (as the
    emulated workcell's qfrc_actuator after mj_step is).
    """

    def rollout(*, models, datas, control_signal, initial_states, **_unused):
        n = len(models)
        model = models[0]
        controls = np.stack([c.data[:-1] for c in control_signal])
        steps = controls.shape[1]
        state = np.ascontiguousarray(np.stack(initial_states))
        nstate = state.shape[1]
        joint_qpos = 1 + model.jnt_qposadr[[model.joint(j).id for j in ALL_JOINTS]]
        box = 1 + model.jnt_qposadr[model.body(BOX_BODY).jntadr[0]]
        outputs = np.empty((n, steps, N_SENSORS))
        buffer_state = np.empty((n, block_steps, nstate))
        buffer_sensor = np.empty((n, block_steps, model.nsensordata))
        for start in range(0, steps, block_steps):
            stop = min(steps, start + block_steps)
            length = stop - start
            st, sd = mj_rollout.rollout(models, datas, state, np.ascontiguousarray(controls[:, start:stop]),
                                        state=buffer_state[:, :length] if length == block_steps else None,
                                        sensordata=buffer_sensor[:, :length] if length == block_steps else None)
            outputs[:, start:stop, POSITION_COLUMNS] = st[:, :, joint_qpos]
            outputs[:, start:stop, EFFORT_COLUMNS] = sd[:, :, EFFORT_COLUMNS]
            outputs[:, start:stop, BOX_COLUMNS] = st[:, :, box:box + 3]
            state = np.ascontiguousarray(st[:, -1])
        dt = model.opt.timestep
        trajectories = []
        for i in range(n):
            times = control_signal[i].times[0] + dt * np.arange(1, steps + 1)
            trajectories.append(sysid.SystemTrajectory(
                model=models[i], control=control_signal[i], sensordata=sysid.TimeSeries(times, outputs[i]),
                initial_state=initial_states[i], state=sysid.TimeSeries(times, times[:, None])))
        return trajectories

    return rollout


def _weighted_residual(weights_by_series: dict[int, np.ndarray]):
    """A sysid ModifyResidualFn: predicted sensors at the measured times, weighted by 1/noise."""

    def modify(params, predicted, measured, model, return_pred_all, state=None, **_unused):
        weights = weights_by_series[id(measured)]
        used = weights > 0
        resampled = predicted.resample(measured.times)
        residual = (measured.data[:, used] - resampled.data[:, used]) * weights[used]
        return residual, sysid.TimeSeries(measured.times, resampled.data, measured.signal_mapping), measured

    return modify


class Stage:
    """One least-squares problem: variables, fixed values, segments; wraps sysid for it."""

    def __init__(self, name: str, spec: mujoco.MjSpec, base: mujoco.MjModel, variables: list[FitVariable],
                 fixed: Mapping[str, float], segments: list[Segment], settings: IdentificationSettings) -> None:
        self.name = name
        self.spec = spec
        self.variables = variables
        self.factory = ModelFactory(base, variables, fixed)
        self.segments = segments
        self.settings = settings
        self.threads = settings.threads or os.cpu_count() or 1
        self._weights: dict[int, np.ndarray] = {}
        self.sequences = []
        sensor_spec = identification_spec(spec)
        for i, segment in enumerate(segments):
            sequence = sysid.ModelSequences(f"{name}_{i}", sensor_spec, segment.recording.name,
                                            segment.initial_state, segment.control, segment.measured)
            # ModelSequences wraps the same TimeSeries object: key its weights by identity
            self._weights[id(sequence.measured_rollout[0].sensordata)] = segment.weights
            self.sequences.append(sequence)
        self.residual_fn = sysid.build_residual_fn(
            models_sequences=self.sequences, build_model=lambda params, _spec: self.factory.build(params.as_vector()),
            custom_rollout=_blocked_rollout(settings.block_steps), modify_residual=_weighted_residual(self._weights),
            n_threads=self.threads, resample_true=False)
        self.evaluations = 0

    def parameter_dict(self, x0: np.ndarray) -> sysid.ParameterDict:
        params = sysid.ParameterDict()
        low_m, high_m = self.settings.multiplier_bounds
        for variable, xi in zip(self.variables, x0):
            if variable.is_delay:
                low, high = (b / DELAY_UNIT_S for b in self.settings.delay_bounds_s)
            else:
                low, high = math.log(low_m), math.log(high_m)
            parameter = sysid.Parameter(variable.name, nominal=variable.x0(), min_value=low, max_value=high)
            parameter.value[:] = float(np.clip(xi, low, high))
            params.add(parameter)
        return params

    def residual(self, x: np.ndarray) -> np.ndarray:
        params = self.parameter_dict(np.zeros(len(self.variables)))
        residuals, _, _ = self.residual_fn(np.asarray(x, dtype=float), params)
        self.evaluations += 1 if np.ndim(x) == 1 else np.shape(x)[1]
        return np.concatenate(residuals)

    def segment_residuals(self, x: np.ndarray) -> list[np.ndarray]:
        params = self.parameter_dict(np.zeros(len(self.variables)))
        residuals, _, _ = self.residual_fn(np.asarray(x, dtype=float), params)
        return residuals

    def fit(self, x0: np.ndarray, progress: ProgressFn,
            cancelled: Callable[[], bool]) -> tuple[np.ndarray, int, np.ndarray | None]:
        """sysid.optimize from x0: (optimum, iterations, Jacobian of the last iteration)."""
        params = self.parameter_dict(x0)
        iterations = [0]

        def on_iteration(trace) -> None:
            iterations[0] = len(trace)
            progress(self.name, min(0.95, len(trace) / self.settings.max_iterations),
                     f"{self.name}: iteration {len(trace)}, cost {float(trace[-1].objective):.4g}")
            if cancelled():
                raise IdentificationCancelled(f"cancelled during {self.name}")

        def counted(x, p, **kwargs):
            self.evaluations += 1 if np.ndim(x) == 1 else np.shape(x)[1]
            if cancelled():
                raise IdentificationCancelled(f"cancelled during {self.name}")
            return self.residual_fn(x, p, **kwargs)

        optimized, result = sysid.optimize(initial_params=params, residual_fn=counted, optimizer="mujoco",
                                           verbose=False, max_iters=self.settings.max_iterations,
                                           eps=self.settings.fd_step, xtol=self.settings.xtol,
                                           iter_callback=on_iteration, output=io.StringIO())
        return optimized.as_vector(), iterations[0], result.jac

    def jacobian(self, x: np.ndarray, r: np.ndarray) -> np.ndarray:
        params = self.parameter_dict(x)
        low, high = params.get_bounds()
        jac, _ = mj_minimize.jacobian_fd(lambda xs: self.residual(xs), x.reshape(-1, 1), r.reshape(-1, 1),
                                         np.float64(self.settings.fd_step), 0,
                                         [low.reshape(-1, 1), high.reshape(-1, 1)])
        return jac


def autocorrelation_time(residuals: Sequence[np.ndarray], columns: int, max_lag: int = 400) -> float:
    """Integrated autocorrelation time of the residual signals (1 for white noise).

    Each segment's residual is (samples x columns) flattened row-major; per column,
    tau = 1 + 2 sum rho_k over lags until rho first drops below zero (Geyer's initial
    positive sequence, simplified); the columns are pooled weighted by their variance.
    """
    taus, weights = [], []
    for flat in residuals:
        series = flat.reshape(-1, columns)
        for c in range(series.shape[1]):
            e = series[:, c] - series[:, c].mean()
            var = float(e @ e) / max(len(e), 1)
            if var <= 0 or len(e) < 10:
                continue
            n = len(e)
            spectrum = np.fft.rfft(e, 2 * n)
            acf = np.fft.irfft(spectrum * np.conj(spectrum))[:min(max_lag, n - 1)] / (var * n)
            negative = np.nonzero(acf[1:] < 0)[0]
            cut = negative[0] + 1 if len(negative) else len(acf)
            taus.append(1.0 + 2.0 * float(np.sum(acf[1:cut])))
            weights.append(var * n)
    if not taus:
        return 1.0
    return max(1.0, float(np.average(taus, weights=weights)))


# ----------------------------------------------------------------------------- the identification

def excited_joints(recordings: Sequence[Recording], settings: IdentificationSettings) -> dict[str, float]:
    """Travel of each joint over the fit recordings (max over recordings)."""
    travel = {j: 0.0 for j in ALL_JOINTS}
    for recording in recordings:
        for joint, value in recording.motion_range().items():
            travel[joint] = max(travel[joint], value)
    return travel


def box_moves(recording: Recording, settings: IdentificationSettings) -> np.ndarray:
    """Push windows [(start, end)] of a recording: where the box moved, with margins."""
    if len(recording.box_t) < 3:
        return np.zeros((0, 2))
    speed = np.linalg.norm(np.diff(recording.box_pose[:, :2], axis=0), axis=1) / np.diff(recording.box_t)
    moving = recording.box_t[1:][speed > settings.box_speed_threshold_m_s]
    if len(moving) == 0:
        return np.zeros((0, 2))
    windows = []
    before, after = settings.push_margin_s
    start = prev = moving[0]
    for t in moving[1:]:
        if t - prev > before + after:
            windows.append((start - before, prev + after))
            start = t
        prev = t
    windows.append((start - before, prev + after))
    last = recording.state_t[-1]
    return np.array([(max(recording.state_t[0], a), min(last, b)) for a, b in windows])


def _guidance_for(name: str) -> str:
    quantity = name.split(".")[-1]
    joint = name.split(".")[1] if name.count(".") == 2 else ""
    hints = {
        "friction_loss": f"slow motion with many velocity reversals of {joint}",
        "damping": f"motion of {joint} over a wider range of speeds",
        "armature": f"faster (higher-frequency) motion of {joint}, for larger accelerations",
        "kp": f"larger tracking errors of {joint} (faster or loaded motion)",
        "kv": f"faster motion of {joint}",
        "delay_s": "sharper command changes (higher excitation band)",
        "mass_kg": "pushes at different accelerations (vary speed_m_s)",
        "friction": ("pushes that let the box slide freely (faster pushes)" if name == "box.friction" else
                     "off-centre pushes, so the box slides along the fingers"),
    }
    return hints.get(quantity, "more varied excitation")


def identify(spec: mujoco.MjSpec, prior: Mapping[str, float], fit: Sequence[Recording], *,
             held_out: Sequence[Recording] = (), settings: IdentificationSettings = IdentificationSettings(),
             select: Sequence[str] = (), progress: ProgressFn = lambda *_: None,
             cancelled: Callable[[], bool] = lambda: False) -> IdentificationResult:
    """Identify the physics of `spec` (the parent twin's scene) from fit recordings.

    `prior`: the parent twin's parameter means (every name of twinloop_twin.nominal's
    physics_parameters). `select`: name prefixes to identify (empty: everything the data
    can identify); the rest keep the prior.
    """
    if not fit:
        raise IdentificationError("no fit recording given: record an identification session with split 'fit'")
    for recording in fit:
        if recording.split != "fit":
            raise IdentificationError(f"recording {recording.name} is split '{recording.split}': held-out data "
                                      "never fits the twin; pass it as held-out")
    for recording in held_out:
        if recording.split != "held_out":
            raise IdentificationError(f"recording {recording.name} is split '{recording.split}', given as held-out")
    for recording in fit:
        if recording.duration_s < settings.min_duration_s:
            raise IdentificationError(f"recording {recording.name} lasts {recording.duration_s:.1f} s, shorter "
                                      f"than {settings.min_duration_s:.1f} s: record a longer excitation")
    chosen = lambda name: not select or any(name.startswith(s) for s in select)  # noqa: E731
    push_windows = {r.name: box_moves(r, settings) for r in fit}
    arm_recordings = [r for r in fit if len(push_windows[r.name]) == 0]
    push_recordings = [r for r in fit if len(push_windows[r.name])]
    travel = excited_joints(fit, settings)
    estimates: dict[str, Estimate] = {}
    stages: list[StageReport] = []
    correlations: dict[tuple[str, str], float] = {}
    derived: dict[str, Estimate] = {}
    guidance: list[str] = []
    values = dict(prior)

    def unidentified(name: str, note: str) -> None:
        estimates[name] = Estimate(name, prior[name], float("nan"), float("nan"), float("nan"), prior[name], False, note)

    # ---- arm stage: joint dynamics, gains, delay -----------------------------------------
    variables: list[FitVariable] = []
    if arm_recordings:
        for joint in COMMANDED_JOINTS:
            limit = settings.min_finger_motion_m if joint in FINGER_JOINTS else settings.min_motion_rad
            names = [f"joint.{joint}.{q}" for q in JOINT_QUANTITIES] + [f"actuator.{joint}.{q}" for q in GAIN_QUANTITIES]
            if travel[joint] < limit:
                for name in names + ([f"joint.panda_finger_joint2.{q}" for q in JOINT_QUANTITIES]
                                     if joint == "panda_finger_joint1" else []):
                    if name in prior:
                        unidentified(name, f"{joint} never moved in the fit data (travel {travel[joint]:.4g} < "
                                           f"{limit}); add excitation of {joint}")
                guidance.append(f"{joint} never moved (travel {travel[joint]:.4g}): excite it to identify its "
                                "friction, damping, armature and gains")
                continue
            for name in names:
                if not chosen(name):
                    continue
                if joint == "panda_finger_joint1" and name.startswith("joint."):
                    # finger 2 mimics finger 1: only the pair's sum is observable; one multiplier for both
                    twin = name.replace("panda_finger_joint1", "panda_finger_joint2")
                    variables.append(FitVariable(name, (name, twin), (prior[name], prior[twin])))
                else:
                    variables.append(FitVariable(name, (name,), (prior[name],)))
        if chosen(DELAY):
            variables.append(FitVariable(DELAY, (DELAY,), (max(prior[DELAY], settings.delay_bounds_s[0]),)))
    elif not push_recordings:
        raise IdentificationError("no usable fit recording")
    else:
        guidance.append("no joint excitation among the fit recordings: joint dynamics, gains and the delay keep "
                        "their prior; record `twinloop build excite --kind joints`")
    if variables:
        spec_fixed = {n: v for n, v in values.items() if not any(n in var.targets for var in variables)}
        contact = any(_touches(spec, r) for r in arm_recordings[:1])
        weights = column_weights(settings, box=False)
        has_delay = any(v.is_delay for v in variables)
        x_start = np.array([v.x0() for v in variables])
        if has_delay:
            # 1) everything, the delayed command read by linear interpolation (continuous in the
            #    delay), started from the servo-law estimate of the delay and the gains
            smooth = base_model(spec, contacts=contact, interpolate_delay=True)
            segments = [make_segment(smooth, r, r.state_t[0], r.state_t[-1], weights) for r in arm_recordings]
            delay_stage = Stage("arm_delay", spec, smooth, variables, spec_fixed, segments,
                                dataclasses.replace(settings, max_iterations=settings.delay_stage_iterations))
            x_first = _equation_error_start(smooth, arm_recordings, variables, x_start, settings, progress)
            first_result = _run_stage(delay_stage, x_first, settings, progress, cancelled)
            stages.append(first_result["report"])
            x_start = first_result["x"].copy()
            delay_index = next(i for i, v in enumerate(variables) if v.is_delay)
            _collect(delay_stage, first_result, prior, settings, estimates, correlations, guidance, travel,
                     only=(DELAY,))
            # 2) the delay acts in whole physics steps (zero-order hold, as on the workcell and
            #    in the twin's scene): the best whole step near the estimate, then held
            held = _whole_step_delay(spec, contact, segments, weights, variables, x_start, spec_fixed,
                                     float(first_result["x"][delay_index]) * DELAY_UNIT_S, settings)
            # the delay is reported as the whole step that acts like the workcell; its std adds the
            # step's quantization (uniform over one step: dt / sqrt(12)) to the fitted std
            continuous = estimates[DELAY]
            std = math.hypot(continuous.std, smooth.opt.timestep / math.sqrt(12))
            z = continuous.ci_high - continuous.mean
            z = (z / continuous.std) if continuous.std > 0 else 1.96
            estimates[DELAY] = dataclasses.replace(
                continuous, mean=held, std=std, ci_low=held - z * std, ci_high=held + z * std,
                note=(f"{continuous.note}; " if continuous.note else "")
                + f"whole physics steps (zero-order hold); continuous estimate {continuous.mean * 1e3:.3f} ms")
            keep = [i for i, v in enumerate(variables) if not v.is_delay]
            spec_fixed = dict(spec_fixed, **{DELAY: held})
            variables, x_start = [variables[i] for i in keep], x_start[keep]
    if variables:
        # 3) everything else (and the gains again) with zero-order hold, exactly as the twin acts
        base = base_model(spec, contacts=contact)
        segments = [make_segment(base, r, r.state_t[0], r.state_t[-1], weights) for r in arm_recordings]
        stage = Stage("arm", spec, base, variables, spec_fixed, segments, settings)
        result = _run_stage(stage, x_start, settings, progress, cancelled)
        _collect(stage, result, prior, settings, estimates, correlations, guidance, travel)
        stages.append(result["report"])
        values.update({n: e.mean for n, e in estimates.items() if not math.isnan(e.std)})
    if DELAY in estimates and not math.isnan(estimates[DELAY].std):
        values[DELAY] = estimates[DELAY].mean

    # ---- push stage: box mass and friction, finger friction ------------------------------
    box_variables = [FitVariable(n, (n,), (prior[n],)) for n in BOX_PARAMETERS if chosen(n)]
    if push_recordings and box_variables:
        base = base_model(spec, contacts=True)
        # contact forces make efforts spiky (a millisecond of contact timing is a large effort
        # error); pushes are fitted on positions and the box pose, efforts weighted down
        weights = column_weights(dataclasses.replace(settings, effort_std_nm=settings.push_effort_std_nm), box=True)
        segments = [make_segment(base, r, a, b, weights) for r in push_recordings for a, b in push_windows[r.name]]
        fixed = {n: v for n, v in values.items() if n not in BOX_PARAMETERS}
        fixed[DELAY] = round(fixed[DELAY] / base.opt.timestep) * base.opt.timestep  # as the twin's scene will act
        fixed.update({n: prior[n] for n in BOX_PARAMETERS if not chosen(n)})
        stage = Stage("box", spec, base, box_variables, fixed, segments, settings)
        result = _run_contact_stage(stage, np.zeros(len(box_variables)), settings, progress, cancelled)
        _collect(stage, result, prior, settings, estimates, correlations, guidance, travel)
        derived.update(_sliding_force(stage, result, settings, estimates, guidance))
        stages.append(result["report"])
    elif box_variables:
        for name in BOX_PARAMETERS:
            if name not in estimates:
                unidentified(name, "no push of the box in the fit data; record `twinloop build excite --kind pushes`")
        guidance.append("no push in the fit data: box mass and friction keep their prior")
    for name in prior:
        if name not in estimates:
            note = ("not selected for identification" if not chosen(name) else
                    "finger 2 mimics finger 1: it has no actuator" if name.startswith("actuator.panda_finger_joint2")
                    else "not identified")
            unidentified(name, note)
    out = IdentificationResult(estimates, stages, guidance, correlations, derived=derived)
    if held_out:
        progress("held_out", 0.0, f"predicting {len(held_out)} held-out recording(s)")
        evaluate_held_out(spec, prior, out, held_out, settings)
    return out


def _touches(spec: mujoco.MjSpec, recording: Recording) -> bool:
    """Whether replaying the recording's commands on the model meets any contact with the robot."""
    from twinloop_builder.excitation import WorkspaceChecker
    model = spec.compile()
    checker = WorkspaceChecker(model, table_height_m=0.0)
    for row in recording.position[::25]:
        checker.set(dict(zip(ALL_JOINTS, row)))
        if checker.robot_contacts():
            return True
    return False


def _equation_error_start(model: mujoco.MjModel, recordings: Sequence[Recording], variables: list[FitVariable],
                          x: np.ndarray, settings: IdentificationSettings, progress: ProgressFn) -> np.ndarray:
    """Start values of the delay and the arm gains from the servo law itself, no simulation.

    The reported effort is kp (u(t - delay) - q) - kv qdot + g(q) (gravity compensation), linear
    in kp and kv for a given delay: per candidate delay (whole steps up to the bound), a
    linear least-squares fit per joint; the delay with the smallest residual wins. This is a
    starting point only (the fit below refines everything); started from the nominal gains
    instead, a coarse delay search absorbs a gain error into the delay (a soft servo lags
    like a delayed one).
    """
    data = mujoco.MjData(model)
    qpos = model.jnt_qposadr[[model.joint(j).id for j in ALL_JOINTS]]
    dof = model.jnt_dofadr[[model.joint(j).id for j in ARM_JOINTS]]
    arm = [ALL_JOINTS.index(j) for j in ARM_JOINTS]
    commanded_arm = [COMMANDED_JOINTS.index(j) for j in ARM_JOINTS]
    dt = model.opt.timestep
    low, high = settings.delay_bounds_s
    candidates = np.arange(max(low, dt), high + dt / 2, dt)
    rows = []
    for recording in recordings:
        gravity = np.empty((len(recording.state_t), len(ARM_JOINTS)))
        for i, q in enumerate(recording.position):
            data.qpos[qpos] = q
            mujoco.mj_forward(model, data)
            gravity[i] = data.qfrc_gravcomp[dof]
        # the effort reported at t was computed from the state one step earlier
        rows.append((recording, gravity))
    costs, gains = [], []
    for delay in candidates:
        cost, kpkv = 0.0, []
        for c, a in zip(commanded_arm, arm):
            xs, ys = [], []
            for recording, gravity in rows:
                t = recording.state_t[1:]
                u = recording.commands_on_grid(t - dt - delay)[:, c]
                xs.append(np.column_stack([u - recording.position[:-1, a], -recording.velocity[:-1, a]]))
                ys.append(recording.effort[1:, a] - gravity[:-1, arm.index(a)])
            X, y = np.vstack(xs), np.concatenate(ys)
            solution, residual, *_ = np.linalg.lstsq(X, y, rcond=None)
            cost += float(np.sum((X @ solution - y) ** 2))
            kpkv.append(solution)
        costs.append(cost)
        gains.append(kpkv)
    best = int(np.argmin(costs))
    progress("arm_delay", 0.02, f"servo-law start: delay {candidates[best] * 1e3:.0f} ms")
    start = x.copy()
    low_m, high_m = settings.multiplier_bounds
    for i, variable in enumerate(variables):
        if variable.is_delay:
            start[i] = candidates[best] / DELAY_UNIT_S
        elif variable.name.startswith("actuator.") and variable.name.split(".")[1] in ARM_JOINTS:
            joint = ARM_JOINTS.index(variable.name.split(".")[1])
            value = gains[best][joint][0 if variable.name.endswith(".kp") else 1]
            if value > 0:
                start[i] = float(np.clip(math.log(value / variable.priors[0]), math.log(low_m) + 0.01,
                                         math.log(high_m) - 0.01))
    return start


def _whole_step_delay(spec, contact, segments, weights, variables, x, fixed, delay_s: float,
                      settings: IdentificationSettings) -> float:
    """The whole-step delay (floor or ceil of the continuous estimate) that fits best under zero-order hold."""
    base = base_model(spec, contacts=contact)
    dt = base.opt.timestep
    # whole steps around the continuous estimate (linear interpolation and the zero-order hold
    # of the workcell can disagree by a step: the buffer is read before it is written)
    center = round(delay_s / dt)
    candidates = sorted({max(1, k) * dt for k in range(center - 2, center + 3)})
    keep = [i for i, v in enumerate(variables) if not v.is_delay]
    zoh = [make_segment(base, s.recording, s.start_s, s.end_s, weights) for s in segments]
    costs = []
    for candidate in candidates:
        stage = Stage("arm_delay_step", spec, base, [variables[i] for i in keep], dict(fixed, **{DELAY: candidate}),
                      zoh, settings)
        r = stage.residual(x[keep])
        costs.append(float(r @ r))
    return candidates[int(np.argmin(costs))]


def _run_stage(stage: Stage, x0: np.ndarray, settings: IdentificationSettings, progress: ProgressFn,
               cancelled: Callable[[], bool]) -> dict:
    started = time.monotonic()
    r0 = stage.residual(x0)
    progress(stage.name, 0.05, f"{stage.name}: fitting {len(stage.variables)} parameters on "
                               f"{len(stage.segments)} segment(s), cost {float(r0 @ r0):.4g}")
    x, iterations, jac = stage.fit(x0, progress, cancelled)
    progress(stage.name, 0.96, f"{stage.name}: covariance at the optimum")
    r = stage.residual(x)
    if jac is None or jac.shape != (len(r), len(x)) or settings.fresh_jacobian:
        jac = stage.jacobian(x, r)
    segment_residuals = stage.segment_residuals(x)
    columns = [int(np.count_nonzero(s.weights)) for s in stage.segments]
    tau = float(np.average([autocorrelation_time([res], c) for res, c in zip(segment_residuals, columns)],
                           weights=[len(res) for res in segment_residuals]))
    sigma, half_width = sysid.calculate_intervals([r], jac, alpha=1.0 - settings.confidence)
    sigma = sigma * tau
    half_width = half_width * math.sqrt(tau)
    report = StageReport(stage.name, [v.name for v in stage.variables], sorted({s.recording.name for s in stage.segments}),
                         iterations, stage.evaluations, float(r0 @ r0), float(r @ r), tau, time.monotonic() - started,
                         float(np.sqrt(r @ r / max(len(r), 1))))
    return {"x": x, "sigma": sigma, "half_width": half_width, "report": report, "jac": jac}


def _run_contact_stage(stage: Stage, x0: np.ndarray, settings: IdentificationSettings, progress: ProgressFn,
                       cancelled: Callable[[], bool]) -> dict:
    """Nelder-Mead on the stage's cost, then a quadratic response surface around the optimum
    for the covariance (the module docstring says why). Returns what _run_stage returns."""
    from scipy.optimize import minimize
    from scipy.stats import norm, qmc

    started = time.monotonic()
    low, high = (b.ravel() for b in stage.parameter_dict(x0).get_bounds())
    n = len(x0)
    budget = settings.push_max_evaluations + settings.push_surface_samples + 2

    def cost(x: np.ndarray) -> float:
        if cancelled():
            raise IdentificationCancelled(f"cancelled during {stage.name}")
        r = stage.residual(np.clip(x, low, high))
        if stage.evaluations % 10 == 0:
            progress(stage.name, min(0.95, stage.evaluations / budget),
                     f"{stage.name}: {stage.evaluations} of ~{budget} evaluations")
        return float(r @ r)

    cost_before = cost(x0)
    progress(stage.name, 0.01, f"{stage.name}: fitting {n} parameters on {len(stage.segments)} push(es), "
                               f"cost {cost_before:.4g}")
    simplex = np.clip(np.vstack([x0, x0 + 0.3 * np.eye(n)]), low, high)  # first moves of ~35 %
    found = minimize(cost, x0, method="Nelder-Mead", bounds=list(zip(low, high)),
                     options={"initial_simplex": simplex, "maxfev": settings.push_max_evaluations,
                              "xatol": 1e-3, "fatol": 1e-3 * cost_before})
    x_best, cost_best = np.asarray(found.x, dtype=float), float(found.fun)

    # Response surface: a full quadratic in the log-multipliers, least squares over samples
    # spread evenly (Sobol) in a box around the optimum.
    radius = settings.push_surface_radius
    samples = settings.push_surface_samples
    unit = qmc.Sobol(n, seed=0).random(2 ** math.ceil(math.log2(samples)))[:samples] * 2.0 - 1.0
    points = np.vstack([x_best, np.clip(x_best + radius * unit, low, high)])
    costs = np.array([cost_best] + [cost(point) for point in points[1:]])
    d = points - x_best
    pairs = list(itertools.combinations_with_replacement(range(n), 2))
    design = np.column_stack([np.ones(len(d)), d] + [d[:, i] * d[:, j] for i, j in pairs])
    coef, *_ = np.linalg.lstsq(design, costs, rcond=None)
    scatter = costs - design @ coef
    sigma_c = float(np.sqrt(scatter @ scatter / max(len(costs) - design.shape[1], 1)))
    gradient = coef[1:n + 1]
    hessian = np.zeros((n, n))
    for k, (i, j) in enumerate(pairs):
        hessian[i, j] = hessian[j, i] = coef[n + 1 + k] * (2.0 if i == j else 1.0)
    curvature, directions = np.linalg.eigh(hessian)
    # A direction is determined when the trend rises by more than the cost's own scatter
    # within the sampled region; along the others the data prefer nothing.
    determined = curvature * radius ** 2 / 2.0 > sigma_c
    x = x_best
    if determined.any():
        basis = directions[:, determined]
        step = np.clip(basis @ (-(basis.T @ gradient) / curvature[determined]), -radius, radius)
        candidate = np.clip(x_best + step, low, high)
        cost_candidate = cost(candidate)
        if cost_candidate <= cost_best + sigma_c:  # the trend's minimum, unless chaos disagrees there
            x = candidate
    span = float(np.max((high - low) / 2.0)) ** 2  # undetermined: anywhere in the search range
    variance = np.where(determined, 2.0 * sigma_c / np.where(determined, curvature, 1.0), span)
    sigma = directions @ np.diag(variance) @ directions.T
    half_width = norm.ppf(0.5 + settings.confidence / 2.0) * np.sqrt(np.diag(sigma))
    r = stage.residual(x)
    report = StageReport(stage.name, [v.name for v in stage.variables], sorted({s.recording.name for s in stage.segments}),
                         int(found.nit), stage.evaluations, cost_before, float(r @ r), 1.0, time.monotonic() - started,
                         float(np.sqrt(r @ r / max(len(r), 1))))
    return {"x": x, "sigma": sigma, "half_width": half_width, "report": report, "jac": None}


def _sliding_force(stage: Stage, result: dict, settings: IdentificationSettings, estimates: Mapping[str, Estimate],
                   guidance: list[str]) -> dict[str, Estimate]:
    """box.mass_kg * box.friction (the sliding force over g), which slow pushes determine even
    when they cannot tell the two apart."""
    from scipy.stats import norm

    names = [v.name for v in stage.variables]
    if "box.mass_kg" not in names or "box.friction" not in names:
        return {}
    e = np.zeros(len(names))
    e[[names.index("box.mass_kg"), names.index("box.friction")]] = 1.0
    std_log = float(np.sqrt(max(e @ result["sigma"] @ e, 0.0)))
    mass, friction = estimates["box.mass_kg"], estimates["box.friction"]
    product = mass.mean * friction.mean
    half = norm.ppf(0.5 + settings.confidence / 2.0) * std_log
    identifiable = std_log <= settings.max_relative_std
    name = "box.mass_kg*box.friction"
    note = f"sliding force {product * 9.81:.3g} N"
    if identifiable and not (mass.identifiable and friction.identifiable):
        guidance.append(f"the pushes determine {name} = {product:.4g} kg (±{std_log:.0%}; {note}) but not "
                        "box.mass_kg and box.friction each: add pushes with sharp starts and stops (the box's "
                        "inertia), or weigh the box and identify box.friction alone")
    return {name: Estimate(name, product, product * std_log, product * math.exp(-half), product * math.exp(half),
                           mass.prior * friction.prior, identifiable, note)}


def _collect(stage: Stage, result: dict, prior: Mapping[str, float], settings: IdentificationSettings,
             estimates: dict[str, Estimate], correlations: dict, guidance: list[str], travel: Mapping[str, float],
             only: Sequence[str] | None = None) -> None:
    x, sigma, half = result["x"], result["sigma"], result["half_width"]
    rms = result["report"].residual_rms
    # A model that leaves residuals far above the sensor noise does not explain the data
    # (e.g. a workcell that lagged, commands that arrived late): no number from it is confident.
    inadequate = rms > settings.max_residual_rms
    if inadequate:
        guidance.append(f"stage {stage.name}: residuals {rms:.1f}x the sensor noise; its parameters are not trusted. "
                        "Record again with steady command timing (check the workcell's lag_skips and load)")
    std_x = np.sqrt(np.clip(np.diag(sigma), 0, None))
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = sigma / np.outer(std_x, std_x)
    names = [v.name for v in stage.variables]
    params = stage.parameter_dict(x)
    low, high = params.get_bounds()
    for i, variable in enumerate(stage.variables):
        if only is not None and variable.name not in only:
            continue
        at_bound = min(x[i] - low[i], high[i] - x[i]) < 1e-3 * (high[i] - low[i])
        others = [(abs(corr[i, k]), names[k]) for k in range(len(names)) if k != i and np.isfinite(corr[i, k])]
        worst = max(others) if others else (0.0, "")
        for k in range(len(names)):
            if k != i and np.isfinite(corr[i, k]) and abs(corr[i, k]) > 0.8:
                correlations[tuple(sorted((names[i], names[k])))] = float(corr[i, k])
        for target, mean in variable.physical(float(x[i])).items():
            if variable.is_delay:
                std = std_x[i] * DELAY_UNIT_S
                lo, hi = (x[i] - half[i]) * DELAY_UNIT_S, (x[i] + half[i]) * DELAY_UNIT_S
            else:
                # log-parametrized: the std of the value is value * std of the log (delta method)
                std = mean * std_x[i]
                lo, hi = mean * math.exp(-half[i]), mean * math.exp(half[i])
            relative = std / abs(mean) if mean else float("inf")
            identifiable = bool(np.isfinite(std) and relative <= settings.max_relative_std and not at_bound
                                and not inadequate)
            note = ""
            if target.startswith("joint.panda_finger_joint"):
                identifiable = False
                note = "finger 2 mimics finger 1: only the sum over both fingers is observable; both scaled together"
            elif inadequate:
                note = (f"not identifiable: the model leaves residuals {rms:.1f}x the sensor noise (> "
                        f"{settings.max_residual_rms:g}x), so it does not explain this recording; record again "
                        "with steady command timing (an unloaded workcell host)")
            elif not identifiable:
                why = (f"at its search bound ({mean:.4g})" if at_bound else
                       f"relative std {relative:.0%} > {settings.max_relative_std:.0%}")
                confound = f"; confounded with {worst[1]} (correlation {worst[0]:.2f})" if worst[0] > 0.8 else ""
                note = f"not identifiable from this data: {why}{confound}; add {_guidance_for(target)}"
                guidance.append(f"{target}: {note}")
            if not np.isfinite(std):
                std = abs(prior[target])
            estimates[target] = Estimate(target, float(mean), float(std), float(lo), float(hi), prior[target],
                                         identifiable, note)


# ----------------------------------------------------------------------------- held-out prediction

def predict_positions(spec: mujoco.MjSpec, values: Mapping[str, float], recording: Recording,
                      settings: IdentificationSettings) -> tuple[np.ndarray, np.ndarray]:
    """(times, joint positions (N, 9)) the model predicts for the recording, open loop from its first state."""
    base = base_model(spec, contacts=True)
    model = copy.copy(base)
    values = dict(values)
    values[DELAY] = max(base.opt.timestep, round(values[DELAY] / base.opt.timestep) * base.opt.timestep)
    apply_parameters(model, values)
    segment = make_segment(model, recording, recording.state_t[0], recording.state_t[-1],
                           column_weights(settings, box=False))
    rollout = _blocked_rollout(settings.block_steps)
    trajectory = rollout(models=[model], datas=[mujoco.MjData(model)], control_signal=[segment.control],
                         initial_states=[segment.initial_state])[0]
    predicted = trajectory.sensordata.resample(segment.measured.times)
    return segment.measured.times, predicted.data[:, POSITION_COLUMNS]


def evaluate_held_out(spec: mujoco.MjSpec, prior: Mapping[str, float], result: IdentificationResult,
                      held_out: Sequence[Recording], settings: IdentificationSettings) -> None:
    """Joint position RMSE on held-out recordings, nominal (prior) vs identified, arm joints."""
    identified = {n: e.mean for n, e in result.estimates.items()}
    arm = [ALL_JOINTS.index(j) for j in ARM_JOINTS]
    errors = {"before": [], "after": []}
    for recording in held_out:
        for key, values in (("before", prior), ("after", identified)):
            times, predicted = predict_positions(spec, values, recording, settings)
            measured = np.stack([np.interp(times, recording.state_t, recording.position[:, c]) for c in arm], axis=1)
            errors[key].append(predicted[:, arm] - measured)
    before, after = np.vstack(errors["before"]), np.vstack(errors["after"])
    result.held_out_rmse_before_rad = float(np.sqrt(np.mean(before ** 2)))
    result.held_out_rmse_after_rad = float(np.sqrt(np.mean(after ** 2)))
    result.held_out_per_joint = {j: (float(np.sqrt(np.mean(before[:, i] ** 2))), float(np.sqrt(np.mean(after[:, i] ** 2))))
                                 for i, j in enumerate(ARM_JOINTS)}
