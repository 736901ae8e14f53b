"""The arm stages: joint friction loss, damping and armature, actuator gains and the command
delay, from recordings without box motion. Pure Python.

1. everything, the delayed command read by linear interpolation (continuous in the delay),
   started from the servo-law estimate of the delay and the gains (`servo_law_start`);
2. the delay set to the whole physics step that fits best under zero-order hold, as the
   workcell and the twin's scene act (`whole_step_delay`);
3. everything but the delay again under zero-order hold.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

import mujoco
import numpy as np

from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS, COMMANDED_JOINTS

from twinloop_builder.identification.data import (FitData, Segment, column_weights, make_segment, touches_robot,
                                                  whole_segments)
from twinloop_builder.identification.fit import Stage, fit_least_squares
from twinloop_builder.identification.identifiability import stage_estimates
from twinloop_builder.identification.model import FitVariable, base_model, mimic_leaders, prismatic_joints
from twinloop_builder.identification.results import StageOutcome, unidentified
from twinloop_builder.identification.settings import (DELAY, DELAY_UNIT_S, GAIN_QUANTITIES, JOINT_QUANTITIES,
                                                      IdentificationSettings, ProgressFn)
from twinloop_builder.recording import RecordedMotion


def arm_variables(model: mujoco.MjModel, prior: Mapping[str, float], data: FitData, settings: IdentificationSettings,
                  chosen: Callable[[str], bool]) -> tuple[list[FitVariable], StageOutcome]:
    """The variables the arm stages fit, and the parameters of joints that never moved
    (kept at the prior, flagged, with guidance)."""
    mimic = mimic_leaders(model)
    prismatic = prismatic_joints(model)
    out = StageOutcome()
    variables: list[FitVariable] = []
    for joint in COMMANDED_JOINTS:
        limit = settings.min_finger_motion_m if joint in prismatic else settings.min_motion_rad
        followers = [f for f, leader in mimic.items() if leader == joint]
        names = [f"joint.{joint}.{q}" for q in JOINT_QUANTITIES] + [f"actuator.{joint}.{q}" for q in GAIN_QUANTITIES]
        travel = data.travel[joint]
        if travel < limit:
            for name in names + [f"joint.{f}.{q}" for f in followers for q in JOINT_QUANTITIES]:
                if name in prior:
                    out.estimates[name] = unidentified(name, prior[name], (
                        f"{joint} never moved in the fit data (travel {travel:.4g} < {limit}); add excitation "
                        f"of {joint}"))
            out.guidance.append(f"{joint} never moved (travel {travel:.4g}): excite it to identify its "
                                "friction, damping, armature and gains")
            continue
        # A mimic joint (finger 2) gets its own friction, damping and armature: its equality is
        # soft and its position is measured, and real fingers (and drawn truths) differ. Tied
        # to the leader's multiplier, the pair's mismatch went into the leader's gain: kp 1518
        # +- 26 for a true 1652 on a drawn truth, 5 std off.
        names += [f"joint.{f}.{q}" for f in followers for q in JOINT_QUANTITIES]
        for name in names:
            if chosen(name):
                variables.append(FitVariable(name, (name,), (prior[name],)))
    if chosen(DELAY):
        variables.append(FitVariable(DELAY, (DELAY,), (max(prior[DELAY], settings.delay_bounds_s[0]),)))
    return variables, out


def identify_arm(spec: mujoco.MjSpec, prior: Mapping[str, float], values: Mapping[str, float], data: FitData,
                 variables: list[FitVariable], settings: IdentificationSettings, progress: ProgressFn,
                 cancelled: Callable[[], bool]) -> StageOutcome:
    """The arm stages on data.arm; `values` holds everything the stages do not fit."""
    out = StageOutcome()
    fixed = {n: v for n, v in values.items() if not any(n in var.targets for var in variables)}
    contact = any(touches_robot(spec, r) for r in data.arm[:1])
    weights = column_weights(settings, box=False)
    x_start = np.array([v.x0() for v in variables])
    smooth = base_model(spec, contacts=contact, interpolate_delay=True)
    mimic = mimic_leaders(smooth)
    if any(v.is_delay for v in variables):
        # 1) the delay continuous, from the servo-law start
        segments = whole_segments(smooth, data.arm, weights)
        delay_stage = Stage("arm_delay", spec, smooth, variables, fixed, segments,
                            dataclasses.replace(settings, max_iterations=settings.delay_stage_iterations))
        first = fit_least_squares(delay_stage, servo_law_start(smooth, data.arm, variables, x_start, settings, progress),
                                  settings, progress, cancelled)
        out.reports.append(first.report)
        x_start = first.x.copy()
        delay_index = next(i for i, v in enumerate(variables) if v.is_delay)
        continuous = stage_estimates(delay_stage, first, prior, settings, mimic=mimic, only=(DELAY,))
        out.add(dataclasses.replace(continuous, reports=[]))
        # 2) the best whole step near the estimate, then held
        held = whole_step_delay(spec, contact, segments, weights, variables, x_start, fixed,
                                float(first.x[delay_index]) * DELAY_UNIT_S, settings)
        out.estimates[DELAY] = held_delay(out.estimates[DELAY], held, smooth.opt.timestep)
        keep = [i for i, v in enumerate(variables) if not v.is_delay]
        fixed = dict(fixed, **{DELAY: held})
        variables, x_start = [variables[i] for i in keep], x_start[keep]
    if variables:
        # 3) everything else (and the gains again) with zero-order hold, exactly as the twin acts
        base = base_model(spec, contacts=contact)
        stage = Stage("arm", spec, base, variables, fixed, whole_segments(base, data.arm, weights), settings)
        final = fit_least_squares(stage, x_start, settings, progress, cancelled)
        out.add(stage_estimates(stage, final, prior, settings, mimic=mimic))
        out.reports.append(final.report)
    return out


def held_delay(continuous, held_s: float, timestep_s: float):
    """The delay reported from the whole step that acts like the workcell: under zero-order
    hold every delay in (held - dt, held] acts as `held`, so the recordings tell the step, not
    where in it the cell's delay lies. Reported: the step's middle (which the twin's scene
    acts as `held` again), its std the fitted one and the step's quantization (uniform over
    one step: dt / sqrt(12)) together. (Reporting `held` itself put every true delay half a
    step below the estimate on average: z RMS 2.0 over drawn truths.)"""
    std = math.hypot(continuous.std, timestep_s / math.sqrt(12))
    z = continuous.ci_high - continuous.mean
    z = (z / continuous.std) if continuous.std > 0 else 1.96
    mean = held_s - timestep_s / 2.0
    return dataclasses.replace(
        continuous, mean=mean, std=std, ci_low=mean - z * std, ci_high=mean + z * std,
        note=(f"{continuous.note}; " if continuous.note else "")
        + f"acts as {round(held_s * 1e3, 3):g} ms in whole physics steps (zero-order hold), the middle of that step "
          f"reported; continuous estimate {continuous.mean * 1e3:.3f} ms")


def servo_law_start(model: mujoco.MjModel, recordings: Sequence[RecordedMotion], variables: list[FitVariable],
                    x: np.ndarray, settings: IdentificationSettings, progress: ProgressFn) -> np.ndarray:
    """Start values of the delay and the arm gains from the servo law itself, no simulation.

    The reported effort is kp (u(t - delay) - q) - kv qdot + g(q) (gravity compensation), linear
    in kp and kv for a given delay: per candidate delay (whole steps up to the bound), a
    linear least-squares fit per joint; the delay with the smallest residual wins. This is a
    starting point only (the fit refines everything); started from the nominal gains
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
            solution, *_ = np.linalg.lstsq(X, y, rcond=None)
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


def whole_step_delay(spec: mujoco.MjSpec, contact: bool, segments: Sequence[Segment], weights: np.ndarray,
                     variables: list[FitVariable], x: np.ndarray, fixed: Mapping[str, float], delay_s: float,
                     settings: IdentificationSettings) -> float:
    """The whole-step delay near the continuous estimate that fits best under zero-order hold."""
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
        stage.close()
        costs.append(float(r @ r))
    return candidates[int(np.argmin(costs))]
