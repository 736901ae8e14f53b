"""The data stage of identification: recordings checked, split into what excites the arm and
what pushes the box, and cut into sysid segments (initial state, controls, measurements).
Pure Python."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import mujoco
import numpy as np
from mujoco import sysid

from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS, COMMANDED_JOINTS
from twinloop_twin.scene import command_actuator_ids, fill_command_history

from twinloop_builder.identification.model import (BOX_COLUMNS, EFFORT_COLUMNS, N_JOINTS, N_SENSORS,
                                                   POSITION_COLUMNS)
from twinloop_builder.identification.settings import BOX_BODY, IdentificationError, IdentificationSettings
from twinloop_builder.recording import RecordedMotion


@dataclass
class Segment:
    """A time window of a recording, as sysid data: initial state, controls, measurements."""

    recording: RecordedMotion
    start_s: float
    end_s: float
    initial_state: np.ndarray
    control: sysid.TimeSeries
    measured: sysid.TimeSeries
    weights: np.ndarray  # (N_SENSORS,)


@dataclass(frozen=True)
class FitData:
    """The fit recordings, sorted by what they excite."""

    arm: list[RecordedMotion]  # no box motion: joint dynamics, gains, delay
    pushes: list[RecordedMotion]  # the box moved
    push_windows: dict[str, np.ndarray]  # recording name -> [(start_s, end_s)] where the box moved
    travel: dict[str, float]  # joint -> peak-to-peak travel over all fit recordings


def check_recordings(fit: Sequence[RecordedMotion], held_out: Sequence[RecordedMotion],
                     settings: IdentificationSettings) -> None:
    """Raise IdentificationError, saying what to record, when the data cannot be used."""
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


def sort_fit_data(fit: Sequence[RecordedMotion], settings: IdentificationSettings) -> FitData:
    windows = {r.name: push_windows(r, settings) for r in fit}
    return FitData(arm=[r for r in fit if len(windows[r.name]) == 0], pushes=[r for r in fit if len(windows[r.name])],
                   push_windows=windows, travel=joint_travel(fit))


def joint_travel(recordings: Sequence[RecordedMotion]) -> dict[str, float]:
    """Travel of each joint over the recordings (max over recordings)."""
    travel = {j: 0.0 for j in ALL_JOINTS}
    for recording in recordings:
        for joint, value in recording.motion_range().items():
            travel[joint] = max(travel[joint], value)
    return travel


def push_windows(recording: RecordedMotion, settings: IdentificationSettings) -> np.ndarray:
    """Windows [(start, end)] where the box moved on the table or the gripper held it (a
    lift: the fingers stalled, slower than holding_speed_m_s, short of their target), with
    margins. A lifted box is not
    judged from its pose: a tracker that expects the box on the table need not follow it
    up; the held box's weight shows in the arm's joints."""
    before, after = settings.push_margin_s
    box = _box_moving_times(recording, settings)
    moving = np.concatenate([box[(box >= a) & (box <= b)] for a, b in _groups(box, before + after)
                             if _moved(recording, a, b, settings)] or [np.zeros(0)])
    if len(recording.command_t):
        commanded = recording.commands_on_grid(recording.state_t)
        for finger in (j for j in COMMANDED_JOINTS if j not in ARM_JOINTS):
            column = ALL_JOINTS.index(finger)
            short = recording.position[:, column] - commanded[:, COMMANDED_JOINTS.index(finger)]
            stalled = np.abs(recording.velocity[:, column]) < settings.holding_speed_m_s
            moving = np.union1d(moving, recording.state_t[(short > settings.holding_lead_m) & stalled])
    first, last = recording.state_t[0], recording.state_t[-1]
    return np.array([(max(first, a - before), min(last, b + after))
                     for a, b in _groups(np.unique(moving), before + after)]).reshape(-1, 2)


def _box_moving_times(recording: RecordedMotion, settings: IdentificationSettings) -> np.ndarray:
    """The tracked poses' times where the box's speed on the table, over at least
    box_speed_base_s back, exceeds the threshold. Pairs of poses stamped with the same
    camera time (seen in a run of the quick loop under load) never count."""
    t, xy = recording.box_t, recording.box_pose[:, :2]
    if len(t) < 3:
        return np.zeros(0)
    back = np.searchsorted(t, t - settings.box_speed_base_s, side="right") - 1
    valid = back >= 0
    i, j = np.nonzero(valid)[0], back[valid]
    dt = t[i] - t[j]
    distance = np.linalg.norm(xy[i] - xy[j], axis=1)
    speed = np.divide(distance, dt, out=np.zeros_like(dt), where=dt > 0)
    return t[i[speed > settings.box_speed_threshold_m_s]]


def _moved(recording: RecordedMotion, start: float, end: float, settings: IdentificationSettings) -> bool:
    """Whether the box's median tracked position after a stretch of motion ((end, end +
    base]) is at least box_moved_m from the one before it ([start - 2 base, start - base),
    base = box_speed_base_s; the nearest pose where a span has none)."""
    t, xy = recording.box_t, recording.box_pose[:, :2]
    base = settings.box_speed_base_s
    pre = xy[(t >= start - 2 * base) & (t < start - base)]
    if not len(pre):  # the last pose before the stretch (the first one if none)
        pre = xy[max(int(np.searchsorted(t, start)) - 1, 0)][None]
    post = xy[(t > end) & (t <= end + base)]
    if not len(post):  # the first pose after it (the last one if none)
        post = xy[min(int(np.searchsorted(t, end, side="right")), len(t) - 1)][None]
    return bool(np.linalg.norm(np.median(post, axis=0) - np.median(pre, axis=0)) >= settings.box_moved_m)


def _groups(times: np.ndarray, gap_s: float) -> list[tuple[float, float]]:
    """Sorted times split where consecutive ones are more than gap_s apart: [(first, last)]."""
    if len(times) == 0:
        return []
    cuts = np.nonzero(np.diff(times) > gap_s)[0]
    return [(float(times[a]), float(times[b])) for a, b in zip(np.r_[0, cuts + 1], np.r_[cuts, len(times) - 1])]


def touches_robot(spec: mujoco.MjSpec, recording: RecordedMotion) -> bool:
    """Whether the recorded joint positions bring the robot into any contact."""
    from twinloop_builder.excitation import WorkspaceChecker
    model = spec.compile()
    checker = WorkspaceChecker(model, table_height_m=0.0)
    for row in recording.position[::25]:
        checker.set(dict(zip(ALL_JOINTS, row)))
        if checker.robot_contacts():
            return True
    return False


def column_weights(settings: IdentificationSettings, *, box: bool) -> np.ndarray:
    """1 / noise of each compared sensor column (0: not compared)."""
    w = np.zeros(N_SENSORS)
    w[POSITION_COLUMNS] = 1.0 / settings.position_std_rad
    effort = np.zeros(N_JOINTS)
    for j in COMMANDED_JOINTS:
        effort[ALL_JOINTS.index(j)] = 1.0 / settings.effort_std_nm
    w[EFFORT_COLUMNS] = effort
    if box:
        w[BOX_COLUMNS.start:BOX_COLUMNS.start + 2] = 1.0 / settings.box_position_std_m  # x, y on the table
    return w


def make_segment(model: mujoco.MjModel, recording: RecordedMotion, start_s: float, end_s: float,
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


def whole_segments(model: mujoco.MjModel, recordings: Sequence[RecordedMotion], weights: np.ndarray) -> list[Segment]:
    return [make_segment(model, r, r.state_t[0], r.state_t[-1], weights) for r in recordings]
