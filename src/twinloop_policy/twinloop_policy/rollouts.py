"""Many carry episodes in the twin at once: one MjData (and model copy) per episode, stepped
by a pool of threads (MuJoCo's step releases the GIL).

Pure Python (numpy, MuJoCo, torch for the module's targets; no rclpy). An episode starts
above the box (the approach from home is the same joint-space move for every episode and is
not simulated), the fingers open, the box at its drawn start under the physics of its draw;
it settles, plays the module's `targets` for the chosen squeeze and carry duration at the
policy rate, lets the box come to rest and reports how it ended (`task.EpisodeEnd`).
"""
from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Mapping, Sequence

import mujoco
import numpy as np
import torch

from twinloop_policy.carry import ACTION_JOINTS, CarryPolicy
from twinloop_policy.task import EpisodeEnd, TaskConfig, box_tilt_rad
from twinloop_twin.model_parameters import apply_parameters
from twinloop_twin.physics import FINGER_JOINTS
from twinloop_twin.residual import ResidualTorque, ResidualWeights
from twinloop_twin.scene import command_actuator_ids, fill_command_history, joint_qpos_addresses, reset_to_home


@dataclass(frozen=True)
class Episode:
    parameters: Mapping[str, float]  # physics of this episode (apply_parameters names)
    box_xy: np.ndarray  # true box start
    seen_box_offset: np.ndarray  # the box's offset from its planned place as the tracker reports it
    goal_xy: np.ndarray
    squeeze_m: float
    carry_s: float


class CarryRollouts:
    def __init__(self, model: mujoco.MjModel, policy: CarryPolicy, task: TaskConfig, box_link: str,
                 box_z_m: float, *, workers: int = 2, residual: ResidualWeights | None = None) -> None:
        """`residual`: the twin version's learned residual (twinloop_twin.residual), applied
        before every physics step of every episode (it costs a Python call per step)."""
        self.model, self.policy, self.task = model, policy, task
        self.residual = residual
        self.box_z_m = box_z_m
        self.box_link = box_link
        self.workers = max(1, int(workers))
        self._arm = joint_qpos_addresses(model, ACTION_JOINTS[:7])
        self._fingers = joint_qpos_addresses(model, FINGER_JOINTS)
        self._actuators = command_actuator_ids(model, ACTION_JOINTS)
        joint = model.body(box_link).jntadr[0]
        self._box = int(model.jnt_qposadr[joint])
        self._box_dof = int(model.jnt_dofadr[joint])
        self._substeps = max(1, int(round(1.0 / (task.episode.policy_rate_hz * model.opt.timestep))))
        self.steps_taken = 0  # physics steps, for throughput measurements

    def run(self, episodes: Sequence[Episode]) -> list[EpisodeEnd]:
        if self.workers == 1 or len(episodes) <= 1:
            return [self.run_one(e) for e in episodes]
        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self.run_one, episodes))

    def targets(self, episode: Episode) -> np.ndarray:
        """The module's targets for this episode from the descent's start, one row per command."""
        dt = 1.0 / self.task.episode.policy_rate_hz
        tau = torch.arange(0.0, self.policy.total_s(float(episode.carry_s)), dt, dtype=torch.float64)
        goal_offset = torch.tensor(np.asarray(episode.goal_xy) - self.policy.planned_goal_xy.numpy(),
                                   dtype=torch.float64)
        with torch.no_grad():
            return self.policy.targets(tau, float(episode.squeeze_m), float(episode.carry_s),
                                       torch.tensor(np.asarray(episode.seen_box_offset), dtype=torch.float64),
                                       goal_offset).numpy()

    def run_one(self, episode: Episode) -> EpisodeEnd:
        model = copy.copy(self.model)
        apply_parameters(model, episode.parameters)
        data = mujoco.MjData(model)
        if self.residual is not None:
            residual = ResidualTorque(model, self.residual)

            def advance(steps: int) -> None:
                residual.step(data, steps)
        else:
            def advance(steps: int) -> None:
                mujoco.mj_step(model, data, nstep=steps)
        rows = self.targets(episode)
        reset_to_home(model, data)
        data.qpos[self._arm] = rows[0, :7]
        data.qpos[self._fingers] = rows[0, 7]
        data.qpos[self._box:self._box + 7] = [*episode.box_xy, self.box_z_m, 1.0, 0.0, 0.0, 0.0]
        data.ctrl[self._actuators] = rows[0]
        fill_command_history(model, data)
        mujoco.mj_forward(model, data)
        steps = int(round(self.task.carry.settle_s / model.opt.timestep))
        advance(steps)
        gripper = self._actuators[-1]
        grip = 0.0
        for row in rows:
            data.ctrl[self._actuators] = row
            advance(self._substeps)
            grip = max(grip, abs(float(data.actuator_force[gripper])))
        steps += len(rows) * self._substeps
        rest = int(round(self.task.episode.rest_s / model.opt.timestep))
        advance(rest)
        self.steps_taken += steps + rest  # (threads racing here only blur a throughput count)
        box = data.qpos[self._box:self._box + 7]
        return EpisodeEnd(box_xy=box[:2].copy(),
                          box_speed_m_s=float(np.linalg.norm(data.qvel[self._box_dof:self._box_dof + 3])),
                          box_tilt_rad=box_tilt_rad(box[3:7]), goal_xy=np.asarray(episode.goal_xy, dtype=float),
                          grip_force_n=grip, carry_s=float(episode.carry_s))
