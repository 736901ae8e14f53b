"""The moveit_py backend of `plan()`: MoveIt 2's planning scene, PlanningComponent and
time-optimal time parametrization (TOTG), where moveit_py is installed (a ROS 2 install with
MoveIt 2). Selected with `backend: moveit_py` in config/planning.yaml; `plan()` validates the
start and goal and checks the timed result with the envelope monitor's code whichever
backend found it, so a MoveIt plan is held to the same envelope as an OMPL one.

- The robot: MoveIt's configuration package for the Panda (`moveit_config_package`, default
  moveit_resources_panda_moveit_config: its SRDF, kinematics and planning pipelines) with
  the workcell's own URDF as robot_description (its meshes are example-robot-data's
  package:// files: the ROS package example-robot-data must be installed), and
  config/moveit_cpp.yaml (planning scene monitor, pipelines, request defaults;
  `moveit_cpp_file`).
- The scene: every solid of the twin's scene that is not the robot (`PlanningScene.obstacles`:
  table, board, scanned objects, keep-out boxes) as collision objects in MoveIt's planning
  scene; bodies the robot may touch (`allowed`) are left out.
- The timing: TOTG with scaling 1, then the whole trajectory slowed uniformly (the path
  unchanged) until every joint is within `velocity_fraction`/`acceleration_fraction` of the
  envelope's limits, and sampled at the envelope's command period.

MoveItPy starts its own rclcpp node (`twinloop_moveit`) on the process's ROS_DOMAIN_ID; one
instance serves a process (MoveIt keeps one per node name). Not importable on the machines
this suite is developed on (the ROS 2 Kilted wheels carry no MoveIt): the interface test
(`src/twinloop_planning/test/test_backends.py`) runs it where `moveit` is importable.
"""
from __future__ import annotations

import importlib.util
import math
import tempfile
from pathlib import Path

import numpy as np

from twinloop_planning.scene import Obstacle, PlanningScene
from twinloop_twin.kinematics import matrix_to_quaternion_xyzw
from twinloop_twin.workcell import default_config_dir

AVAILABLE = importlib.util.find_spec("moveit") is not None and importlib.util.find_spec("moveit_configs_utils") is not None
_INSTANCES: dict[tuple, "MoveItBackend"] = {}


class MoveItUnavailable(RuntimeError):
    """moveit_py (or MoveIt's configuration package) is not installed here."""


def moveit_backend(scene: PlanningScene, settings) -> "MoveItBackend":
    """The process's MoveIt backend for this scene (built once: MoveItPy is heavy)."""
    key = (id(scene), settings.moveit_config_package, settings.moveit_group, settings.moveit_cpp_file)
    if key not in _INSTANCES:
        _INSTANCES[key] = MoveItBackend(scene, settings)
    return _INSTANCES[key]


class MoveItBackend:
    def __init__(self, scene: PlanningScene, settings) -> None:
        if not AVAILABLE:
            raise MoveItUnavailable("backend moveit_py: moveit_py is not installed (a ROS 2 install with MoveIt 2 "
                                    "has it); use backend: ompl in config/planning.yaml")
        from moveit.planning import MoveItPy
        from moveit_configs_utils import MoveItConfigsBuilder

        if not scene.urdf_xml:
            raise MoveItUnavailable("backend moveit_py needs the scene's URDF (PlanningScene.from_twin/from_workcell)")
        self.scene, self.group = scene, settings.moveit_group
        # robot_description from a file: the builder runs xacro on it (plain URDF passes through)
        self._urdf = tempfile.NamedTemporaryFile("w", suffix=".urdf", prefix="twinloop_moveit_", delete=False)
        self._urdf.write(scene.urdf_xml)
        self._urdf.close()
        moveit_cpp = settings.moveit_cpp_file or str(default_config_dir() / "moveit_cpp.yaml")
        config = (MoveItConfigsBuilder(robot_name="panda", package_name=settings.moveit_config_package)
                  .robot_description(file_path=self._urdf.name)
                  .moveit_cpp(file_path=moveit_cpp)
                  .to_moveit_configs()
                  .to_dict())
        self.moveit = MoveItPy(node_name="twinloop_moveit", config_dict=config)
        self.component = self.moveit.get_planning_component(self.group)
        self.model = self.moveit.get_robot_model()
        self.arm = list(self.model.get_joint_model_group(self.group).active_joint_model_names)
        unknown = [j for j in self.arm if j not in scene.joint_names]
        if unknown:
            raise MoveItUnavailable(f"MoveIt group {self.group} moves {unknown}, which the envelope does not command")
        self._add_obstacles(scene.obstacles())

    def _add_obstacles(self, obstacles: list[Obstacle]) -> None:
        with self.moveit.get_planning_scene_monitor().read_write() as planning_scene:
            for obstacle in obstacles:
                if obstacle.kind != "plane":  # the floor: nothing of the robot reaches below the table
                    planning_scene.apply_collision_object(collision_object(obstacle, self.model.model_frame))
            planning_scene.current_state.update()

    def trajectory(self, start: np.ndarray, goal: np.ndarray, settings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(positions at the envelope's command period, velocities, the path's waypoints)."""
        from moveit.core.robot_state import RobotState

        from twinloop_planning.planner import PlanningError

        names = list(self.scene.joint_names)
        arm = [names.index(j) for j in self.arm]
        states = []
        for q in (start, goal):
            state = RobotState(self.model)
            state.set_joint_group_positions(self.group, np.asarray(q, dtype=float)[arm])
            state.update()
            states.append(state)
        self.component.set_start_state(robot_state=states[0])
        self.component.set_goal_state(robot_state=states[1])
        result = self.component.plan()
        if not result:
            raise PlanningError("no_path", f"MoveIt found no path ({getattr(result, 'error_code', 'no error code')}); "
                                "the goal may be enclosed; try another goal")
        robot_trajectory = result.trajectory
        waypoints_arm = _arm_positions(robot_trajectory.get_robot_trajectory_msg(), self.arm)[1]
        if not robot_trajectory.apply_totg_time_parameterization(
                velocity_scaling_factor=1.0, acceleration_scaling_factor=1.0,
                resample_dt=self.scene.limits.command_period_s):
            raise PlanningError("would_fault", "MoveIt's time parametrization (TOTG) failed on the path")
        times, arm_positions = _arm_positions(robot_trajectory.get_robot_trajectory_msg(), self.arm)
        full = np.repeat(np.asarray(start, dtype=float)[None, :], len(times), axis=0)
        full[:, arm] = arm_positions
        others = [i for i in range(len(names)) if i not in arm]  # the gripper: a straight ramp over the move
        if times[-1] > 0:
            full[:, others] = start[others] + np.outer(times / times[-1], goal[others] - start[others])
        waypoints = np.repeat(np.asarray(start, dtype=float)[None, :], len(waypoints_arm), axis=0)
        waypoints[:, arm] = waypoints_arm
        waypoints[-1] = goal
        positions, velocities = retime_within_limits(times, full, self.scene, settings)
        return positions, velocities, waypoints


def _arm_positions(msg, arm: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(time from start s, positions (m, len(arm))) of a moveit_msgs/RobotTrajectory."""
    joint_trajectory = msg.joint_trajectory
    columns = [list(joint_trajectory.joint_names).index(j) for j in arm]
    times = np.array([p.time_from_start.sec + p.time_from_start.nanosec * 1e-9 for p in joint_trajectory.points])
    positions = np.array([[p.positions[c] for c in columns] for p in joint_trajectory.points])
    return times, positions


def retime_within_limits(times: np.ndarray, positions: np.ndarray, scene: PlanningScene,
                         settings) -> tuple[np.ndarray, np.ndarray]:
    """A timed path (times from 0, positions per joint of the scene) slowed uniformly until
    its speed and acceleration are within the fractions of the envelope's limits, then
    sampled (linearly) at the envelope's command period, the last sample the path's end.
    Returns (positions, velocities) at the command period."""
    times, positions = np.asarray(times, dtype=float), np.asarray(positions, dtype=float)
    period = scene.limits.command_period_s
    if len(times) < 2 or times[-1] <= 0:
        return positions[-1:].copy(), np.zeros((1, positions.shape[1]))
    vmax = np.minimum(np.array(scene.limits.velocity) * settings.velocity_fraction, settings.max_velocity_rad_s)
    amax = np.array(scene.limits.acceleration) * settings.acceleration_fraction

    def sampled(stretch: float) -> np.ndarray:
        steps = max(1, int(math.ceil(times[-1] * stretch / period)))
        t = np.minimum(np.arange(steps + 1) * period / stretch, times[-1])
        return np.column_stack([np.interp(t, times, positions[:, j]) for j in range(positions.shape[1])])

    stretch = 1.0
    for _ in range(60):
        q = sampled(stretch)
        v = np.abs(np.diff(q, axis=0)) / period
        a = np.abs(np.diff(q, 2, axis=0)) / period**2 if len(q) > 2 else np.zeros((1, q.shape[1]))
        ratio = max(float(np.max(v.max(0) / vmax)), math.sqrt(float(np.max(a.max(0) / amax))))
        if ratio <= 1.0:
            break
        stretch *= max(ratio, 1.01)
    velocities = np.vstack([np.zeros((1, q.shape[1])), np.diff(q, axis=0) / period])
    return q, velocities


def collision_object(obstacle: Obstacle, frame: str):
    """A moveit_msgs/CollisionObject (ADD) of one obstacle in `frame` (the world)."""
    from geometry_msgs.msg import Point, Pose
    from moveit_msgs.msg import CollisionObject
    from shape_msgs.msg import Mesh, MeshTriangle, SolidPrimitive

    msg = CollisionObject()
    msg.header.frame_id = frame
    msg.id = obstacle.name
    msg.operation = CollisionObject.ADD
    pose = Pose()
    pose.position.x, pose.position.y, pose.position.z = (float(v) for v in obstacle.position)
    x, y, z, w = matrix_to_quaternion_xyzw(obstacle.rotation)
    pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w = x, y, z, w
    if obstacle.kind == "mesh":
        mesh = Mesh()
        mesh.vertices = [Point(x=float(a), y=float(b), z=float(c)) for a, b, c in obstacle.vertices]
        mesh.triangles = [MeshTriangle(vertex_indices=[int(i) for i in face]) for face in obstacle.faces]
        msg.meshes, msg.mesh_poses = [mesh], [pose]
    else:
        kinds = {"box": SolidPrimitive.BOX, "sphere": SolidPrimitive.SPHERE, "cylinder": SolidPrimitive.CYLINDER}
        primitive = SolidPrimitive(type=kinds[obstacle.kind])
        # SolidPrimitive's cylinder is (height, radius); ours is (radius, height)
        primitive.dimensions = ([obstacle.size[1], obstacle.size[0]] if obstacle.kind == "cylinder"
                                else [float(v) for v in obstacle.size])
        msg.primitives, msg.primitive_poses = [primitive], [pose]
    return msg


def config_package_path(package: str) -> Path | None:
    """The share folder of MoveIt's configuration package, or None when not installed."""
    if importlib.util.find_spec("ament_index_python") is None:
        return None
    from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

    try:
        return Path(get_package_share_directory(package))
    except PackageNotFoundError:
        return None
