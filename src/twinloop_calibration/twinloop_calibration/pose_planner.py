"""Calibration pose planner: a diverse, reachable set of robot poses that keep the target
in view and stay inside joint and workspace limits.

Pure Python (no rclpy). Kinematics is pinocchio (twinloop_twin.kinematics.UrdfTransforms);
the inverse kinematics is pinocchio's documented closed-loop (CLIK) iteration with damped
least squares, a few lines around pinocchio's own log6/Jlog6/frame Jacobian (pinocchio
ships no IK solver, and pulling in a motion-planning stack for this is not warranted).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pinocchio as pin
from scipy.spatial.transform import Rotation

from twinloop_calibration import se3
from twinloop_calibration.degeneracy import DegenerateData, check_views
from twinloop_calibration.intrinsics import CameraModel
from twinloop_calibration.synthetic import look_at


@dataclass(frozen=True)
class PlannerLimits:
    workspace_min_m: tuple[float, float, float] = (0.1, -0.5, 0.9)  # gripper origin box, world frame
    workspace_max_m: tuple[float, float, float] = (0.8, 0.5, 1.5)
    joint_margin_rad: float = 0.1  # stay this far inside every joint limit
    image_margin_px: float = 20.0  # every target point this far inside the image
    distance_m: tuple[float, float] = (0.30, 0.50)  # camera to target centre
    max_tilt_deg: float = 30.0  # viewing direction from the target normal
    max_roll_deg: float = 50.0  # about the optical axis


@dataclass(frozen=True)
class PlannedPose:
    joint_positions: dict[str, float]
    world_T_gripper: np.ndarray
    world_T_camera: np.ndarray  # nominal (mount from the URDF)


class PosePlanner:
    def __init__(self, model: pin.Model, *, arm_joints: Sequence[str], gripper_frame: str,
                 gripper_T_camera: np.ndarray, world_T_target: np.ndarray, target_points: np.ndarray,
                 camera: CameraModel, limits: PlannerLimits = PlannerLimits()) -> None:
        self.model = model
        self.data = model.createData()
        self.arm_joints = list(arm_joints)
        self.frame_id = model.getFrameId(gripper_frame)
        if self.frame_id >= model.nframes:
            raise ValueError(f"frame '{gripper_frame}' is not in the robot model")
        joints = [model.joints[model.getJointId(name)] for name in self.arm_joints]
        self.q_index = np.array([j.idx_q for j in joints])
        self.v_index = np.array([j.idx_v for j in joints])
        self.lower = model.lowerPositionLimit[self.q_index] + limits.joint_margin_rad
        self.upper = model.upperPositionLimit[self.q_index] - limits.joint_margin_rad
        self.gripper_T_camera = gripper_T_camera
        self.world_T_target = world_T_target
        self.target_points = target_points
        self.camera = camera
        self.limits = limits

    def _q(self, start: Mapping[str, float]) -> np.ndarray:
        q = pin.neutral(self.model)
        for name, value in start.items():
            if self.model.existJointName(name):
                joint = self.model.joints[self.model.getJointId(name)]
                if joint.nq == 1:
                    q[joint.idx_q] = value
        return q

    def forward(self, q: np.ndarray) -> np.ndarray:
        pin.framesForwardKinematics(self.model, self.data, q)
        return self.data.oMf[self.frame_id].homogeneous.copy()

    def inverse(self, world_T_gripper: np.ndarray, q0: np.ndarray, *, iterations: int = 300,
                tolerance: float = 1e-4, damping: float = 1e-6) -> np.ndarray | None:
        desired = pin.SE3(world_T_gripper[:3, :3], world_T_gripper[:3, 3])
        q = q0.copy()
        for _ in range(iterations):
            pin.framesForwardKinematics(self.model, self.data, q)
            current = self.data.oMf[self.frame_id]
            error = pin.log6(current.actInv(desired)).vector
            if np.linalg.norm(error) < tolerance:
                inside = np.all(q[self.q_index] >= self.lower) and np.all(q[self.q_index] <= self.upper)
                return q if inside else None
            jac = pin.computeFrameJacobian(self.model, self.data, q, self.frame_id, pin.ReferenceFrame.LOCAL)
            jac = -pin.Jlog6(current.actInv(desired)) @ jac[:, self.v_index]
            step = -jac.T @ np.linalg.solve(jac @ jac.T + damping * np.eye(6), error)
            velocity = np.zeros(self.model.nv)
            velocity[self.v_index] = step
            q = pin.integrate(self.model, q, velocity * 0.5)
            q[self.q_index] = np.clip(q[self.q_index], self.lower - 0.05, self.upper + 0.05)
        return None

    def visible(self, world_T_camera: np.ndarray) -> bool:
        camera_T_target = se3.inv(world_T_camera) @ self.world_T_target
        points = self.target_points @ camera_T_target[:3, :3].T + camera_T_target[:3, 3]
        if np.any(points[:, 2] < 0.05):
            return False
        pixels = self.camera.project(points)
        margin = self.limits.image_margin_px
        return bool(np.all((pixels[:, 0] > margin) & (pixels[:, 0] < self.camera.width - margin)
                           & (pixels[:, 1] > margin) & (pixels[:, 1] < self.camera.height - margin)))

    def plan(self, count: int, start: Mapping[str, float], *, seed: int = 0,
             candidates: int | None = None) -> list[PlannedPose]:
        """`count` poses, reachable from `start` by IK, diverse in orientation, ordered for short moves."""
        rng = np.random.default_rng(seed)
        limits = self.limits
        q_start = self._q(start)
        centre = (self.world_T_target @ np.append(self.target_points.mean(axis=0), 1.0))[:3]
        normal = -self.world_T_target[:3, 2]  # target z points into the board
        helper = np.array([1.0, 0.0, 0.0]) if abs(normal[0]) < 0.9 else np.array([0.0, 1.0, 0.0])
        u = np.cross(normal, helper)
        u /= np.linalg.norm(u)
        v = np.cross(normal, u)
        found: list[PlannedPose] = []
        for _ in range(candidates or 25 * count):
            tilt = math.radians(limits.max_tilt_deg) * math.sqrt(rng.uniform())
            azimuth = rng.uniform(0, 2 * math.pi)
            direction = math.cos(tilt) * normal + math.sin(tilt) * (math.cos(azimuth) * u + math.sin(azimuth) * v)
            eye = centre + rng.uniform(*limits.distance_m) * direction
            world_T_camera = look_at(eye, centre + rng.normal(0, 0.02, 3),
                                     math.radians(rng.uniform(-limits.max_roll_deg, limits.max_roll_deg)))
            # roll so that the hand stays near its home orientation about the optical axis
            world_T_gripper = world_T_camera @ se3.inv(self.gripper_T_camera)
            position = world_T_gripper[:3, 3]
            if np.any(position < limits.workspace_min_m) or np.any(position > limits.workspace_max_m):
                continue
            q = self.inverse(world_T_gripper, q_start)
            if q is None:
                continue
            achieved = self.forward(q)
            if not self.visible(achieved @ self.gripper_T_camera):
                continue
            found.append(PlannedPose({n: float(q[i]) for n, i in zip(self.arm_joints, self.q_index)},
                                     achieved, achieved @ self.gripper_T_camera))
        if len(found) < count:
            raise DegenerateData(
                f"the planner found only {len(found)} reachable poses with the target in view ({count} asked); "
                "widen distance_m / max_tilt_deg, check the target pose and the workspace limits")
        chosen = _diverse(found, count)
        check_views([p.world_T_gripper for p in chosen], min_views=min(count, 3))
        return _order(chosen, q_start[self.q_index], self.arm_joints)


def _diverse(poses: list[PlannedPose], count: int) -> list[PlannedPose]:
    """Greedy farthest-point selection in orientation (rad) plus position (per 0.1 m)."""
    rotations = Rotation.from_matrix(np.array([p.world_T_gripper[:3, :3] for p in poses]))
    positions = np.array([p.world_T_gripper[:3, 3] for p in poses])
    chosen = [0]
    distance = np.full(len(poses), np.inf)
    while len(chosen) < count:
        last = chosen[-1]
        d = (rotations[last].inv() * rotations).magnitude() + np.linalg.norm(positions - positions[last], axis=1) / 0.1
        distance = np.minimum(distance, d)
        distance[chosen] = -1
        chosen.append(int(np.argmax(distance)))
    return [poses[i] for i in chosen]


def _order(poses: list[PlannedPose], q_start: np.ndarray, joints: list[str]) -> list[PlannedPose]:
    """Nearest neighbour in joint space from the start: short moves between views."""
    remaining = list(poses)
    ordered = []
    current = q_start
    while remaining:
        nearest = min(remaining, key=lambda p: np.abs(np.array([p.joint_positions[j] for j in joints]) - current).max())
        remaining.remove(nearest)
        ordered.append(nearest)
        current = np.array([nearest.joint_positions[j] for j in joints])
    return ordered
