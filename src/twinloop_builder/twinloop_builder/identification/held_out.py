"""Held-out prediction: recordings that never fit the twin, replayed open loop from their
first state with the prior and with the identified parameters. Pure Python."""
from __future__ import annotations

import copy
from typing import Mapping, Sequence

import mujoco
import numpy as np

from twinloop_twin.model_parameters import apply_parameters
from twinloop_twin.physics import ALL_JOINTS, ARM_JOINTS

from twinloop_builder.identification.data import column_weights, make_segment
from twinloop_builder.identification.fit import BlockedRollout
from twinloop_builder.identification.model import POSITION_COLUMNS, base_model
from twinloop_builder.identification.results import HeldOutScore
from twinloop_builder.identification.settings import DELAY, IdentificationSettings
from twinloop_builder.recording import RecordedMotion


def predict_positions(spec: mujoco.MjSpec, values: Mapping[str, float], recording: RecordedMotion,
                      settings: IdentificationSettings) -> tuple[np.ndarray, np.ndarray]:
    """(times, joint positions (N, 9)) the model predicts for the recording, open loop from its first state."""
    base = base_model(spec, contacts=True)
    model = copy.copy(base)
    values = dict(values)
    values[DELAY] = max(base.opt.timestep, round(values[DELAY] / base.opt.timestep) * base.opt.timestep)
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
    return segment.measured.times, predicted.data[:, POSITION_COLUMNS]


def score_held_out(spec: mujoco.MjSpec, prior: Mapping[str, float], identified: Mapping[str, float],
                   held_out: Sequence[RecordedMotion], settings: IdentificationSettings) -> HeldOutScore:
    """Joint position RMSE on held-out recordings, prior vs identified, arm joints."""
    arm = [ALL_JOINTS.index(j) for j in ARM_JOINTS]
    errors = {"before": [], "after": []}
    for recording in held_out:
        for key, values in (("before", prior), ("after", identified)):
            times, predicted = predict_positions(spec, values, recording, settings)
            measured = np.stack([np.interp(times, recording.state_t, recording.position[:, c]) for c in arm], axis=1)
            errors[key].append(predicted[:, arm] - measured)
    before, after = np.vstack(errors["before"]), np.vstack(errors["after"])
    return HeldOutScore(
        rmse_before_rad=float(np.sqrt(np.mean(before ** 2))), rmse_after_rad=float(np.sqrt(np.mean(after ** 2))),
        per_joint={j: (float(np.sqrt(np.mean(before[:, i] ** 2))), float(np.sqrt(np.mean(after[:, i] ** 2))))
                   for i, j in enumerate(ARM_JOINTS)})
