"""One least-squares problem on sysid: rollouts, the noise-weighted residual, the fit and its
covariance. Every stage of identification is built on `Stage`. Pure Python."""
from __future__ import annotations

import io
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Mapping, Sequence

import mujoco
import mujoco.rollout as mj_rollout
import numpy as np
from mujoco import minimize as mj_minimize
from mujoco import sysid

from twinloop_twin.physics import ALL_JOINTS

from twinloop_builder.identification.data import Segment
from twinloop_builder.identification.model import (BOX_COLUMNS, EFFORT_COLUMNS, N_SENSORS, POSITION_COLUMNS,
                                                   FitVariable, ModelFactory, identification_spec)
from twinloop_builder.identification.results import StageFit, StageReport
from twinloop_builder.identification.settings import (BOX_BODY, DELAY_UNIT_S, IdentificationCancelled,
                                                      IdentificationSettings, ProgressFn)


class BlockedRollout:
    """A sysid CustomRolloutFn: mujoco.rollout in blocks, keeping only what the residual compares.

    Positions come from the state after each step (what a joint state sample reports),
    efforts from the sensors, which mj_step evaluates at the start of the step (as the
    emulated workcell's qfrc_actuator after mj_step is). One thread pool serves every block
    and call: mujoco.rollout without a pool starts and stops one per call, which took half
    of identification's time at 100-step blocks.
    """

    def __init__(self, block_steps: int) -> None:
        self.block_steps = block_steps
        self._pool: mj_rollout.Rollout | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _pool_for(self, threads: int) -> mj_rollout.Rollout:
        if self._pool is None or self._pool.nthread != threads:
            self.close()
            self._pool = mj_rollout.Rollout(nthread=threads)
        return self._pool

    def __call__(self, *, models, datas, control_signal, initial_states, **_unused):
        n = len(models)
        model = models[0]
        pool = self._pool_for(len(datas) if len(datas) > 1 else 0)
        block_steps = self.block_steps
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
            st, sd = pool.rollout(models, datas, state, np.ascontiguousarray(controls[:, start:stop]),
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


def weighted_residual(weights_by_series: dict[int, np.ndarray]):
    """A sysid ModifyResidualFn: predicted sensors at the measured times, weighted by 1/noise."""

    def modify(params, predicted, measured, model, return_pred_all, state=None, **_unused):
        weights = weights_by_series[id(measured)]
        used = weights > 0
        resampled = predicted.resample(measured.times)
        residual = (measured.data[:, used] - resampled.data[:, used]) * weights[used]
        return residual, sysid.TimeSeries(measured.times, resampled.data, measured.signal_mapping), measured

    return modify


class _Converged(Exception):
    def __init__(self, x: np.ndarray) -> None:
        super().__init__("converged")
        self.x = x


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
        self.rollouts = [BlockedRollout(settings.block_steps) for _ in self.sequences]
        # sysid rolls its sequences out one after the other (each on the threads of its own
        # rollout); one residual function per segment lets a single candidate's segments
        # (the push windows) run side by side.
        self.segment_fns = [sysid.build_residual_fn(
            models_sequences=[sequence], build_model=lambda params, _spec: self.factory.build(params.as_vector()),
            custom_rollout=rollout, modify_residual=weighted_residual(self._weights), n_threads=self.threads,
            resample_true=False) for sequence, rollout in zip(self.sequences, self.rollouts)]
        self._segment_pool = ThreadPoolExecutor(min(self.threads, len(segments))) if len(segments) > 1 else None
        self.evaluations = 0

    def residual_fn(self, x: np.ndarray, params: sysid.ParameterDict, **kwargs):
        """sysid's residual function over all segments: (residuals, predictions, records)."""
        x = np.asarray(x, dtype=float)
        single = np.ndim(x) == 1 or np.shape(x)[1] == 1
        if self._segment_pool is None or not single:  # a Jacobian's columns already run side by side
            outs = [fn(x, params, **kwargs) for fn in self.segment_fns]
        else:
            outs = list(self._segment_pool.map(lambda fn: fn(x, params.copy(), **kwargs), self.segment_fns))
        return tuple([item for out in outs for item in out[k]] for k in range(3))

    def close(self) -> None:
        for rollout in self.rollouts:
            rollout.close()
        if self._segment_pool is not None:
            self._segment_pool.shutdown()

    def parameter_dict(self, x0: np.ndarray) -> sysid.ParameterDict:
        params = sysid.ParameterDict()
        for variable, xi in zip(self.variables, x0):
            low, high = self.bounds(variable)
            parameter = sysid.Parameter(variable.name, nominal=variable.x0(), min_value=low, max_value=high)
            parameter.value[:] = float(np.clip(xi, low, high))
            params.add(parameter)
        return params

    def bounds(self, variable: FitVariable) -> tuple[float, float]:
        if variable.is_delay:
            low, high = (b / DELAY_UNIT_S for b in self.settings.delay_bounds_s)
            return low, high
        low_m, high_m = self.settings.multiplier_bounds
        return math.log(low_m), math.log(high_m)

    def residual(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate(self.segment_residuals(x))

    def segment_residuals(self, x: np.ndarray) -> list[np.ndarray]:
        params = self.parameter_dict(np.zeros(len(self.variables)))
        residuals, _, _ = self.residual_fn(np.asarray(x, dtype=float), params)
        self.evaluations += 1 if np.ndim(x) == 1 else np.shape(x)[1]
        return residuals

    def fit(self, x0: np.ndarray, progress: ProgressFn,
            cancelled: Callable[[], bool]) -> tuple[np.ndarray, int]:
        """sysid.optimize (MuJoCo's Levenberg-Marquardt) from x0: (optimum, iterations).

        Stops once an accepted step lowers the cost by less than
        settings.converged_step_sigma**2 residual variances: the fit then moved by less
        than that many standard deviations. Left to itself, the optimizer often ends only
        after a run of failed steps at the optimum that raise its regularizer to 1e8, each
        a full rollout (~140 with MuJoCo's default regularizer factor).
        """
        params = self.parameter_dict(x0)
        iterations = [0]
        last = {"x": np.asarray(x0, dtype=float), "size": 1}

        def on_iteration(trace) -> None:
            iterations[0] = len(trace)
            progress(self.name, min(0.95, len(trace) / self.settings.max_iterations),
                     f"{self.name}: iteration {len(trace)}, cost {2.0 * float(trace[-1].objective):.6g}")
            if cancelled():
                raise IdentificationCancelled(f"cancelled during {self.name}")
            # the cost is 0.5 * |r|^2; a 1-sigma move changes |r|^2 by the residual variance
            variance = 2.0 * float(trace[-1].objective) / max(last["size"] - len(x0), 1)
            if 2.0 * float(trace[-1].reduction) < self.settings.converged_step_sigma ** 2 * variance:
                raise _Converged(last["x"].copy())

        def counted(x, p, **kwargs):
            if cancelled():
                raise IdentificationCancelled(f"cancelled during {self.name}")
            columns = 1 if np.ndim(x) == 1 else np.shape(x)[1]
            self.evaluations += columns
            out = self.residual_fn(x, p, **kwargs)
            if columns == 1:
                # a candidate: the accepted step is the last one evaluated before on_iteration
                # (a one-variable Jacobian also has one column, but comes before the step)
                last["x"], last["size"] = np.array(x, dtype=float).ravel(), sum(len(r) for r in out[0])
            return out

        try:
            optimized, _ = sysid.optimize(initial_params=params, residual_fn=counted, optimizer="mujoco",
                                          verbose=False, max_iters=self.settings.max_iterations,
                                          eps=self.settings.fd_step, xtol=self.settings.xtol,
                                          mu_factor=self.settings.lm_mu_factor,
                                          iter_callback=on_iteration, output=io.StringIO())
            return optimized.as_vector(), iterations[0]
        except _Converged as converged:
            return converged.x, iterations[0]

    def jacobian(self, x: np.ndarray, r: np.ndarray) -> np.ndarray:
        params = self.parameter_dict(x)
        low, high = params.get_bounds()
        jac, _ = mj_minimize.jacobian_fd(lambda xs: self.residual(xs), x.reshape(-1, 1), r.reshape(-1, 1),
                                         np.float64(self.settings.fd_step), 0,
                                         [low.reshape(-1, 1), high.reshape(-1, 1)])
        return jac

    def report(self, *, iterations: int, cost_before: float, residual: np.ndarray, inflation: float,
               started: float) -> StageReport:
        r = residual
        return StageReport(self.name, [v.name for v in self.variables],
                           sorted({s.recording.name for s in self.segments}), iterations, self.evaluations,
                           cost_before, float(r @ r), inflation, time.monotonic() - started,
                           float(np.sqrt(r @ r / max(len(r), 1))))


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


def newey_west_scores(jacobian: np.ndarray, segment_residuals: Sequence[np.ndarray], columns: Sequence[int],
                      lags: Sequence[int]) -> np.ndarray:
    """The long-run covariance S of the least-squares scores (Newey-West, Bartlett kernel).

    The score of one sample time t is g_t = sum over its columns of J_row^T r_row (the
    residual of segment k is samples x columns[k], flattened row-major, as `jacobian`'s
    rows); S = sum_t g_t g_t^T + sum_{l=1..L} (1 - l/(L+1)) sum_t (g_t g_{t-l}^T + g_{t-l}
    g_t^T), per segment with its own lag L (`lags`), summed over segments (they are
    independent). Written here: statsmodels' HAC estimator needs pandas, which nothing
    else in the suite uses, for these few lines.
    """
    S = np.zeros((jacobian.shape[1], jacobian.shape[1]))
    row = 0
    for residual, width, lag in zip(segment_residuals, columns, lags):
        rows = jacobian[row:row + len(residual)]
        row += len(residual)
        if width == 0:
            continue
        g = (rows * residual[:, None]).reshape(-1, width, jacobian.shape[1]).sum(axis=1)
        S += g.T @ g
        for shift in range(1, min(lag, len(g) - 1) + 1):
            cross = g[shift:].T @ g[:-shift]
            S += (1.0 - shift / (lag + 1.0)) * (cross + cross.T)
    return S


def fit_least_squares(stage: Stage, x0: np.ndarray, settings: IdentificationSettings, progress: ProgressFn,
                      cancelled: Callable[[], bool]) -> StageFit:
    """Levenberg-Marquardt from x0, then the covariance at the optimum.

    sysid's covariance s^2 (J^T J)^-1 assumes white residuals; recorded residuals are
    correlated in time. The covariance is the sandwich H^-1 S H^-1 with H = J^T J (inverted
    as sysid does) and S the scores' long-run covariance over `settings.interval_lag_s`
    (`newey_west_scores`), measured over drawn truths by bench/uncertainty_calibration.py.
    sysid's covariance times the residuals' integrated autocorrelation time, as before, made
    the intervals about twice too wide (z RMS near 0.5 on four drawn truths)."""
    started = time.monotonic()
    r0 = stage.residual(x0)
    progress(stage.name, 0.05, f"{stage.name}: fitting {len(stage.variables)} parameters on "
                               f"{len(stage.segments)} segment(s), cost {float(r0 @ r0):.6g}")
    x, iterations = stage.fit(x0, progress, cancelled)
    progress(stage.name, 0.96, f"{stage.name}: covariance at the optimum")
    segment_residuals = stage.segment_residuals(x)
    r = np.concatenate(segment_residuals)
    jac = stage.jacobian(x, r)
    columns = [int(np.count_nonzero(s.weights)) for s in stage.segments]
    tau = float(np.average([autocorrelation_time([res], c) for res, c in zip(segment_residuals, columns)],
                           weights=[len(res) for res in segment_residuals]))
    sigma, half_width = sysid.calculate_intervals([r], jac, alpha=1.0 - settings.confidence)
    s2 = float(r @ r) / max(r.size - jac.shape[1], 1)
    inv_h = sigma / s2 if s2 > 0 else np.linalg.pinv(jac.T @ jac)  # (J^T J)^-1, as sysid inverts it
    lags = [max(1, int(round(settings.interval_lag_s * (len(res) // max(c, 1)) / max(seg.end_s - seg.start_s, 1e-9))))
            for res, c, seg in zip(segment_residuals, columns, stage.segments)]
    covariance = inv_h @ newey_west_scores(jac, segment_residuals, columns, lags) @ inv_h
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.sqrt(np.clip(np.diag(covariance), 0, None) / np.diag(sigma))
    report = stage.report(iterations=iterations, cost_before=float(r0 @ r0), residual=r, inflation=tau,
                          started=started)
    stage.close()
    return StageFit(x=x, covariance=covariance, half_width=half_width * np.nan_to_num(scale, nan=1.0), report=report,
                    jacobian=jac)
