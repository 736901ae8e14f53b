"""Held-out prediction: recordings that never fit the twin, replayed open loop from their
first state with the prior and with the identified parameters. Pure Python.

Three errors, each prior vs identified: the arm's joint positions (what every recording
has), the arm's joint efforts (what contacts and payloads change: a box pushed against its
friction loads the arm while the stiff arm hardly deviates in position) and the box's
position on the table (recordings where the tracker saw it move)."""
from __future__ import annotations

import copy
from typing import Mapping, Sequence

import mujoco
import numpy as np

from twinloop_twin.model_parameters import apply_parameters
from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS
from twinloop_twin.scene import acting_command_delay

from twinloop_builder.identification.data import column_weights, make_segment
from twinloop_builder.identification.fit import BlockedRollout
from twinloop_builder.identification.model import BOX_COLUMNS, EFFORT_COLUMNS, POSITION_COLUMNS, base_model
from twinloop_builder.identification.results import HeldOutScore
from twinloop_builder.identification.settings import DELAY, IdentificationSettings
from twinloop_builder.recording import RecordedMotion


def predict_positions(spec: mujoco.MjSpec, values: Mapping[str, float], recording: RecordedMotion,
                      settings: IdentificationSettings) -> tuple[np.ndarray, np.ndarray]:
    """(times, joint positions (N, 9)) the model predicts for the recording, open loop from its first state."""
    times, predicted, _ = predict_sensors(spec, values, recording, settings)
    return times, predicted[:, POSITION_COLUMNS]


def predict_sensors(spec: mujoco.MjSpec, values: Mapping[str, float], recording: RecordedMotion,
                    settings: IdentificationSettings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, predicted, measured): the identification sensors (joint positions, efforts,
    box position; twinloop_builder.identification.model) open loop from the first state."""
    base = base_model(spec, contacts=True)
    model = copy.copy(base)
    values = dict(values)
    values[DELAY] = max(base.opt.timestep, acting_command_delay(values[DELAY], base.opt.timestep))
    apply_parameters(model, values)
    segment = make_segment(model, recording, recording.state_t[0], recording.state_t[-1],
                           column_weights(settings, box=False))
    rollout = BlockedRollout(settings.block_steps)
    try:
        trajectory = rollout(models=[model], datas=[mujoco.MjData(model)], control_signal=[segment.control],
                             initial_states=[segment.initial_state])[0]
    finally:
        rollout.close()
    predicted = trajectory.sensordata.resample(segment.measured.times)
    return segment.measured.times, predicted.data, segment.measured.data


def score_held_out(spec: mujoco.MjSpec, prior: Mapping[str, float], identified: Mapping[str, float],
                   held_out: Sequence[RecordedMotion], settings: IdentificationSettings) -> HeldOutScore:
    """RMSE on held-out recordings, prior vs identified: arm joint positions and efforts,
    and the box's table-plane position where a recording saw the box move (NaN where none did)."""
    arm = [ALL_JOINTS.index(j) for j in ARM_JOINTS]
    position, effort, box = ({"before": [], "after": []} for _ in range(3))
    for recording in held_out:
        moved = len(recording.box_t) > 1 and float(np.ptp(recording.box_pose[:, :2], axis=0).max()) > 0.01
        for key, values in (("before", prior), ("after", identified)):
            times, predicted, measured = predict_sensors(spec, values, recording, settings)
            q = np.stack([np.interp(times, recording.state_t, recording.position[:, c]) for c in arm], axis=1)
            position[key].append(predicted[:, POSITION_COLUMNS][:, arm] - q)
            effort[key].append(predicted[:, EFFORT_COLUMNS][:, arm] - measured[:, EFFORT_COLUMNS][:, arm])
            if moved:
                columns = slice(BOX_COLUMNS.start, BOX_COLUMNS.start + 2)
                box[key].append(predicted[:, columns] - measured[:, columns])

    def rmse(errors: list[np.ndarray]) -> float:
        return float(np.sqrt(np.mean(np.vstack(errors) ** 2))) if errors else float("nan")
    before, after = np.vstack(position["before"]), np.vstack(position["after"])
    return HeldOutScore(
        rmse_before_rad=rmse(position["before"]), rmse_after_rad=rmse(position["after"]),
        per_joint={j: (float(np.sqrt(np.mean(before[:, i] ** 2))), float(np.sqrt(np.mean(after[:, i] ** 2))))
                   for i, j in enumerate(ARM_JOINTS)},
        effort_rmse_before_nm=rmse(effort["before"]), effort_rmse_after_nm=rmse(effort["after"]),
        box_rmse_before_m=rmse(box["before"]), box_rmse_after_m=rmse(box["after"]))
