"""The carry's motion: key poses planned once on the twin's model, played by a TorchScript module.

`plan_carry` (numpy, MuJoCo; offline) solves the key poses of the hand by inverse
kinematics on the twin's model, the hand square to the robot as at home: above the box,
around it, lifted; lifted over the goal, at the goal, above it. With each side's joint
displacement per metre of offset in xy, so the poses follow a box or a goal that is not
where it was planned.

`CarryPolicy` (torch, TorchScript) is the deployable policy. Observation: the 7 arm joint
positions and the box's position in xy as the tracker reports it (9). Action: position
targets of the 7 arm joints and the gripper (8). From its first observation it moves
(minimum jerk in joint space) above the box with the fingers open and waits `settle_s`;
then it reads the box's position and chooses the squeeze and the carry's duration with its
student network (the box's and the goal's offsets in), and plays descend, close, lift,
carry, place, release, retreat: minimum-jerk segments between the key poses. Training
rolls the twin out with the same module's `targets`, so what was trained is what is exported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import mujoco
import numpy as np
import torch

from twinloop_builder.excitation import (DEFAULT_ACCELERATION_LIMITS, TCP_BODY, WorkspaceChecker, solve_ik,
                                         velocity_limits)
from twinloop_policy.task import TaskConfig
from twinloop_twin.physics import ARM_JOINTS
from twinloop_twin.workcell import WorkcellDescription

GRIPPER = "panda_finger_joint1"
ACTION_JOINTS = tuple(ARM_JOINTS) + (GRIPPER,)
MAX_OFFSET_M = 0.03  # box and goal offsets beyond this are not followed (the poses are planned for the nominal ones)


class CarryPlanError(ValueError):
    """The carry cannot be planned on this model (out of reach, in collision)."""


@dataclass(frozen=True)
class CarryPlan:
    poses: np.ndarray  # (6, 7): above box, at box, up at box, up at goal, at goal, above goal
    box_jacobian: np.ndarray  # (7, 2) joint displacement per metre of box offset (world xy), at the box
    goal_jacobian: np.ndarray  # (7, 2) the same at the goal
    box_xy: np.ndarray  # nominal box place the poses were planned for
    goal_xy: np.ndarray  # nominal goal
    box_z_m: float
    box_half_m: float
    open_m: float  # finger opening (home)


def plan_carry(task: TaskConfig, workcell: WorkcellDescription, model: mujoco.MjModel) -> CarryPlan:
    carry = task.carry
    checker = WorkspaceChecker(model, workcell.table_top_height_m)
    home = dict(workcell.home_joint_positions)
    checker.set(home)
    _, rotation = checker.tcp_pose()
    half = workcell.box.size_m[0] / 2.0
    opened = float(home[GRIPPER])
    if half >= opened:
        raise CarryPlanError(f"a box {2 * half:.3f} m wide does not fit between the open fingers ({2 * opened:.3f} m)")
    box = np.array(workcell.box.world_position_m, dtype=float)
    z = max(box[2], workcell.table_top_height_m + half)
    at_box = np.array([box[0], box[1], z])
    goal_xy = box[:2] + task.goal.direction * task.goal.distance_m
    at_goal = np.array([goal_xy[0], goal_xy[1], z])
    up, above = np.array([0.0, 0.0, carry.lift_m]), np.array([0.0, 0.0, carry.above_m])
    poses, q = [], dict(home)
    try:
        for target in (at_box + above, at_box, at_box + up, at_goal + up, at_goal, at_goal + above):
            q = solve_ik(checker, q, target, rotation)
            poses.append([q[j] for j in ARM_JOINTS])
    except ValueError as error:
        raise CarryPlanError(f"the carry cannot be planned: {error}") from None
    poses = np.array(poses)
    jacobians = []
    dofs = model.jnt_dofadr[[model.joint(j).id for j in ARM_JOINTS]]
    for pose in (poses[1], poses[4]):
        checker.set(dict(zip(ARM_JOINTS, pose)))
        jacp = np.zeros((3, model.nv))
        mujoco.mj_jacBody(model, checker.data, jacp, None, model.body(TCP_BODY).id)
        jacobians.append(np.linalg.pinv(jacp[:, dofs])[:, :2])
    return CarryPlan(poses=poses, box_jacobian=jacobians[0], goal_jacobian=jacobians[1], box_xy=box[:2].copy(),
                     goal_xy=goal_xy, box_z_m=float(z), box_half_m=float(half), open_m=opened)


class CarryPolicy(torch.nn.Module):
    """Observation: 7 arm joint positions + box xy (9). Action: 7 arm targets + gripper (8)."""

    def __init__(self, plan: CarryPlan, task: TaskConfig, hidden: int = 32) -> None:
        super().__init__()
        f64 = torch.float64
        c = task.carry
        self.register_buffer("poses", torch.tensor(plan.poses, dtype=f64))
        self.register_buffer("box_jacobian", torch.tensor(plan.box_jacobian, dtype=f64))
        self.register_buffer("goal_jacobian", torch.tensor(plan.goal_jacobian, dtype=f64))
        self.register_buffer("box_xy", torch.tensor(plan.box_xy, dtype=f64))
        self.register_buffer("planned_goal_xy", torch.tensor(plan.goal_xy, dtype=f64))
        self.register_buffer("goal_xy", torch.tensor(plan.goal_xy, dtype=f64))  # the trial's goal (set_goal)
        self.register_buffer("direction", torch.tensor(task.goal.direction, dtype=f64))
        self.box_half = float(plan.box_half_m)
        self.open = float(plan.open_m)
        self.dt = 1.0 / float(task.episode.policy_rate_hz)
        self.approach_s = float(c.approach_s)
        self.settle_s = float(c.settle_s)
        self.fixed_s = [float(c.descend_s), float(c.close_s), float(c.lift_s), 0.0, float(c.place_s),
                        float(c.release_s), float(c.retreat_s)]
        self.squeeze_low, self.squeeze_high = (float(v) for v in c.squeeze_range_m)
        self.carry_low, self.carry_high = (float(v) for v in c.carry_s_range)
        self.max_offset = float(MAX_OFFSET_M)
        self.student = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                           torch.nn.Tanh(), torch.nn.Linear(hidden, 2)).to(f64)
        # one trial's state
        self.register_buffer("step_count", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("q_start", torch.zeros(len(ARM_JOINTS), dtype=f64))
        self.register_buffer("decided", torch.zeros(1, dtype=torch.bool))
        self.register_buffer("choice", torch.zeros(2, dtype=f64))  # squeeze (m), carry (s)
        self.register_buffer("offsets", torch.zeros(2, 2, dtype=f64))  # box, goal

    def features(self, box_offset: torch.Tensor, goal_offset: torch.Tensor) -> torch.Tensor:
        """Student input: the box's offset from its planned place and the goal's from the
        planned goal, along and across the carry, in cm. Shapes (..., 2) each."""
        frame = torch.stack([self.direction, torch.stack([-self.direction[1], self.direction[0]])])
        return torch.cat([box_offset @ frame.T, goal_offset @ frame.T], dim=-1) * 100.0

    def choose(self, box_offset: torch.Tensor, goal_offset: torch.Tensor) -> torch.Tensor:
        """(squeeze m, carry s) for the offsets (..., 2) each: the student's outputs, squashed into their ranges."""
        out = torch.sigmoid(self.student(self.features(box_offset, goal_offset)))
        return torch.stack([self.squeeze_low + (self.squeeze_high - self.squeeze_low) * out[..., 0],
                            self.carry_low + (self.carry_high - self.carry_low) * out[..., 1]], dim=-1)

    def durations(self, carry_s: float) -> torch.Tensor:
        d = list(self.fixed_s)
        d[3] = carry_s
        return torch.tensor(d, dtype=torch.float64)

    def total_s(self, carry_s: float) -> float:
        return float(self.durations(carry_s).sum())

    def keypoints(self, squeeze: float, box_offset: torch.Tensor, goal_offset: torch.Tensor) -> torch.Tensor:
        """(8, 8): arm pose and gripper at each segment boundary."""
        b = self.box_jacobian @ box_offset.clamp(-self.max_offset, self.max_offset)
        g = self.goal_jacobian @ goal_offset.clamp(-self.max_offset, self.max_offset)
        p = self.poses
        # the descent starts where the settle holds the hand (planned pose): it blends the offset in
        arm = torch.stack([p[0], p[1] + b, p[1] + b, p[2] + b, p[3] + g, p[4] + g, p[4] + g, p[5] + g])
        grip = self.box_half - squeeze
        fingers = torch.tensor([self.open, self.open, grip, grip, grip, grip, self.open, self.open],
                               dtype=torch.float64)
        return torch.cat([arm, fingers.unsqueeze(1)], dim=1)

    def targets(self, tau: torch.Tensor, squeeze: float, carry_s: float, box_offset: torch.Tensor,
                goal_offset: torch.Tensor) -> torch.Tensor:
        """Targets (len(tau), 8) at times tau (s) after the descent begins."""
        keys = self.keypoints(squeeze, box_offset, goal_offset)
        durations = self.durations(carry_s)
        ends = torch.cumsum(durations, dim=0)
        starts = ends - durations
        index = torch.bucketize(tau, ends, right=True).clamp(max=len(self.fixed_s) - 1)
        x = ((tau - starts[index]) / (ends[index] - starts[index])).clamp(0.0, 1.0)
        return keys[index] + (keys[index + 1] - keys[index]) * _minimum_jerk(x).unsqueeze(1)

    @torch.jit.export
    def reset(self) -> None:
        self.step_count.zero_()
        self.decided.fill_(False)

    @torch.jit.export
    def set_goal(self, goal_xy: torch.Tensor) -> None:
        self.goal_xy.copy_(goal_xy)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        k = int(self.step_count[0])
        if k == 0:
            self.q_start.copy_(observation[:7])
        self.step_count.add_(1)
        t = k * self.dt
        if t < self.approach_s:
            blend = _minimum_jerk(torch.tensor(t / self.approach_s, dtype=torch.float64))
            arm = self.q_start + (self.poses[0] - self.q_start) * blend
            return torch.cat([arm, torch.tensor([self.open], dtype=torch.float64)])
        if t < self.approach_s + self.settle_s:
            return torch.cat([self.poses[0], torch.tensor([self.open], dtype=torch.float64)])
        if not bool(self.decided[0]):  # the descent's first step: decide from the box as seen now
            self.offsets[0].copy_(observation[7:9] - self.box_xy)
            self.offsets[1].copy_(self.goal_xy - self.planned_goal_xy)
            with torch.no_grad():
                self.choice.copy_(self.choose(self.offsets[0].unsqueeze(0), self.offsets[1].unsqueeze(0))[0])
            self.decided.fill_(True)
        tau = torch.tensor([t - self.approach_s - self.settle_s], dtype=torch.float64)
        return self.targets(tau, float(self.choice[0]), float(self.choice[1]), self.offsets[0], self.offsets[1])[0]


def _minimum_jerk(x: torch.Tensor) -> torch.Tensor:
    """Minimum-jerk progress at normalized time x in [0, 1] (twinloop_twin.motion's profile, in torch)."""
    return 10.0 * x**3 - 15.0 * x**4 + 6.0 * x**5


def limit_ratios(policy: CarryPolicy, workcell: WorkcellDescription, *, velocity_scale: float = 0.5,
                 acceleration_limits: Mapping[str, float] = DEFAULT_ACCELERATION_LIMITS) -> dict[str, float]:
    """The module's targets from home at its rate, at its fastest carry and hardest squeeze,
    as the worst per-step joint speed and acceleration in fractions of the envelope's limits
    (velocity_scale x the URDF's; the acceleration limits): what the envelope monitor checks."""
    home = workcell.home_joint_positions
    policy.reset()
    q = torch.tensor([home[j] for j in ARM_JOINTS], dtype=torch.float64)
    observation = torch.cat([q, policy.box_xy])
    zero = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        approach = [policy(observation) for _ in range(int(round((policy.approach_s + policy.settle_s) / policy.dt)))]
        tau = torch.arange(0.0, policy.total_s(policy.carry_low) + 0.2, policy.dt, dtype=torch.float64)
        rest = policy.targets(tau, policy.squeeze_high, policy.carry_low, zero, zero)
    policy.reset()
    rows = np.vstack([[home[j] for j in ACTION_JOINTS], torch.stack(approach).numpy(), rest.numpy()])
    vmax = velocity_limits(workcell.urdf_xml)
    speed = np.abs(np.diff(rows, axis=0)).max(axis=0) / policy.dt
    accel = np.abs(np.diff(rows, 2, axis=0)).max(axis=0) / policy.dt**2
    return {"speed": float(max(speed[i] / (velocity_scale * vmax[j]) for i, j in enumerate(ACTION_JOINTS))),
            "acceleration": float(max(accel[i] / acceleration_limits[j] for i, j in enumerate(ACTION_JOINTS)))}
