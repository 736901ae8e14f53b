"""A trained carry policy as a policy folder the runner loads unchanged: the TorchScript
module (torch.jit.script of `carry.CarryPolicy`) and policy.yaml with its observation and
action specs, rate, the twin it was trained in (version and hash), the variation, the
training curve and the evaluation in the twin.

Pure Python (torch, yaml; no rclpy).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from twinloop_policy.carry import ACTION_JOINTS, CarryPolicy
from twinloop_policy.policy_spec import FORMAT, ObservationTerm, PolicySpec, write_policy_folder
from twinloop_policy.task import TaskConfig
from twinloop_policy.training import TrainingResult
from twinloop_twin.contract import TRACKED_BOX_POSE_TOPIC
from twinloop_twin.physics import ARM_JOINTS

MODULE_FILE = "policy.pt"
JOINT_MAX_AGE_S = 0.02  # two /joint_states periods at 100 Hz
TRIAL_MARGIN_S = 1.0  # judged this long after the policy's last motion


def trial_timeout_s(policy: CarryPolicy) -> float:
    """The whole sequence at its slowest carry, plus a margin: the box is judged then."""
    return policy.approach_s + policy.settle_s + policy.total_s(policy.carry_high) + TRIAL_MARGIN_S


def policy_spec(result: TrainingResult, task: TaskConfig, *, twin: str, twin_sha256: str,
                name: str | None = None, extra: dict[str, Any] | None = None) -> PolicySpec:
    policy = result.policy
    training: dict[str, Any] = {
        "format": FORMAT, "task": "carry", "task_config": task.source,
        "method": "CEM teacher in the twin, distilled into the student MLP (twinloop_policy.training)",
        "seconds": round(result.seconds, 1), "seed": task.training.seed,
        "settings": dataclasses.asdict(task.training), "twin_sha256": twin_sha256, "curve": result.curve,
        "evaluation_in_twin": result.evaluation.to_dict() if result.evaluation else {}}
    training.update(extra or {})
    randomization = {**result.variation.describe(),
                     "box_start_std_m": task.box_start.position_std_m,
                     "tracker_position_std_m": task.observation.box_position_std_m,
                     "goal_distance_variation_m": task.goal.distance_variation_m}
    goal = policy.goal_xy.numpy()
    timeout = round(trial_timeout_s(policy), 3)
    return PolicySpec(
        folder=Path("."), name=name or f"carry_{result.variation.mode}", version="1", module=MODULE_FILE,
        rate_hz=float(task.episode.policy_rate_hz), action_joints=ACTION_JOINTS,
        observation=(ObservationTerm("arm_position", "joint_position", tuple(ARM_JOINTS), len(ARM_JOINTS),
                                     JOINT_MAX_AGE_S),
                     # The module reads the box once, while it rests under the hand before the grasp
                     # (the tracker reports it then); a tracker that loses the lifted, occluded box
                     # must not stop the trial, so its pose may be as old as the trial.
                     ObservationTerm("box_position", "box_position", (), 2, timeout, topic=TRACKED_BOX_POSE_TOPIC)),
        trial_timeout_s=timeout, goal_joint_positions={}, goal_tolerance_rad=0.01,
        twin_version=twin, randomization=randomization, training=training,
        goal_box_xy=(float(goal[0]), float(goal[1])), goal_radius_m=float(task.goal.radius_m))


def export_policy(folder: Path | str, result: TrainingResult, task: TaskConfig, *, twin: str, twin_sha256: str,
                  name: str | None = None, extra: dict[str, Any] | None = None) -> PolicySpec:
    """Write the new policy folder `folder` (never over an existing one)."""
    spec = policy_spec(result, task, twin=twin, twin_sha256=twin_sha256, name=name, extra=extra)
    result.policy.reset()
    scripted = torch.jit.script(result.policy)
    return write_policy_folder(folder, spec, lambda path: scripted.save(str(path)))
