"""plan(start, goal, scene) -> PlannedTrajectory: a collision-free joint path, timed within
the envelope's limits, checked by the envelope monitor's own code. Pure Python (no rclpy).

1. **Path**: OMPL (its Python bindings) in the envelope's commandable joints, bounded by its
   position limits with margin; a state is valid when `PlanningScene.problem` finds nothing
   (collision, clearance, workspace, keep-out); edges are checked every `resolution_rad`.
   RRTConnect by default, then OMPL's path simplifier. A straight line that is valid is
   taken as it is (no sampling needed: the common short move).
2. **Timing**: ruckig (jerk-limited) from rest to rest along each segment, on the distance
   along it, so every sample stays on the checked straight line; within
   `velocity_fraction` / `acceleration_fraction` of the envelope's limits for every joint,
   sampled at the envelope's command period (one command per sample).
3. **Checked before sent**: the samples go through an `EnvelopeMonitor` (the class the
   monitor node runs) as a stream of commands from the start; a sample it would fault on,
   or one in collision, refuses the plan (PlanningError 'would_fault', with the reason).

Backends (`PlannerSettings.backend`): `ompl` (1 and 2 above, the default) or `moveit_py`
(MoveIt 2's planning scene, PlanningComponent and time parametrization, where moveit_py is
installed: twinloop_planning.moveit_backend). Either way the start and goal are validated
here and 3 holds: a MoveIt plan is checked with the envelope monitor's code too.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from twinloop_planning.scene import PlanningScene
from twinloop_safety.envelope import EnvelopeMonitor

_SEEDED = False
PLANNERS = ("RRTConnect", "AORRTC", "RRTstar", "BITstar", "RRT", "KPIECE1", "BKPIECE1", "LBKPIECE1", "PRM")
BACKENDS = ("ompl", "moveit_py")


class PlanningError(Exception):
    """`code`: 'bad_request' (wrong joint count, non-finite values, an unknown planner),
    'start_invalid', 'goal_invalid', 'no_path' (none within the time limit),
    'would_fault' (the envelope check refused the timed path), 'ik_failed'."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PlannerSettings:
    planner: str = "RRTConnect"
    time_limit_s: float = 2.0  # s of OMPL planning per attempt
    attempts: int = 3  # planning attempts (each with the time limit) before 'no_path'
    resolution_rad: float = 0.02  # rad: joint-space distance between two checked states along an edge
    # (the envelope monitor's sample_spacing_rad; the clearance covers what lies between)
    simplify: bool = True
    simplify_s: float = 0.5  # s OMPL's simplifier may spend shortening the path
    velocity_fraction: float = 0.8  # of the envelope's velocity limits
    acceleration_fraction: float = 0.8  # of the envelope's acceleration limits
    max_velocity_rad_s: float = math.inf  # a stage's own cap on every joint's speed (rad/s, m/s for a finger)
    jerk_per_acceleration: float = 10.0  # jerk limit = this x the acceleration limit (1/s)
    seed: int | None = 0  # OMPL's sampler seed, taken by a process's first plan (None: OMPL's own)
    backend: str = "ompl"  # ompl | moveit_py (where installed)
    moveit_config_package: str = "moveit_resources_panda_moveit_config"  # SRDF, kinematics, pipelines
    moveit_group: str = "panda_arm"
    moveit_cpp_file: str = ""  # MoveItPy's settings; empty: config/moveit_cpp.yaml

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise PlanningError("bad_request", f"backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.planner not in PLANNERS:
            raise PlanningError("bad_request", f"planner {self.planner!r} is not one of {', '.join(PLANNERS)}")
        for name in ("time_limit_s", "resolution_rad", "jerk_per_acceleration", "max_velocity_rad_s"):
            if not getattr(self, name) > 0:
                raise PlanningError("bad_request", f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("velocity_fraction", "acceleration_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise PlanningError("bad_request", f"{name} must be in (0, 1], got {getattr(self, name)}")
        if self.attempts < 1:
            raise PlanningError("bad_request", f"attempts must be >= 1, got {self.attempts}")


@dataclass(frozen=True)
class PlannedTrajectory:
    joint_names: tuple[str, ...]
    waypoints: np.ndarray  # (k, n) the collision-checked path's corners, start first
    period_s: float  # one sample per command period
    positions: np.ndarray  # (m, n) the targets to command, one per period; the first is the start
    velocities: np.ndarray  # (m, n)
    planning_s: float  # s spent finding, timing and checking the path
    sampled: bool = field(default=True)  # False: the straight line was valid

    @property
    def duration_s(self) -> float:
        return (len(self.positions) - 1) * self.period_s

    @property
    def path_length_rad(self) -> float:
        return float(np.sum(np.linalg.norm(np.diff(self.waypoints, axis=0), axis=1)))

    def at(self, t: float) -> np.ndarray:
        k = min(max(int(round(t / self.period_s)), 0), len(self.positions) - 1)
        return self.positions[k].copy()


def plan(start: Sequence[float], goal: Sequence[float], scene: PlanningScene,
         settings: PlannerSettings = PlannerSettings()) -> PlannedTrajectory:
    """A timed, checked trajectory from `start` to `goal` (the scene's joint_names order)."""
    began = time.perf_counter()
    start, goal = _joints(start, scene, "start"), _joints(goal, scene, "goal")
    problem = scene.problem(start)
    if problem is not None:
        raise PlanningError("start_invalid", f"the start is not a valid state: {problem}; start from a valid state "
                            "(a robot standing there: jog it clear first)")
    problem = scene.problem(goal)
    if problem is not None:
        raise PlanningError("goal_invalid", f"the goal is not a valid state: {problem}; choose another goal")
    if settings.backend == "moveit_py":
        from twinloop_planning.moveit_backend import MoveItUnavailable, moveit_backend

        try:
            positions, velocities, waypoints = moveit_backend(scene, settings).trajectory(start, goal, settings)
        except MoveItUnavailable as error:
            raise PlanningError("bad_request", str(error)) from None
        sampled = True
    elif _motion_valid(scene, start, goal, settings.resolution_rad):
        waypoints, sampled = np.stack([start, goal]), False
        positions, velocities = time_path(waypoints, scene, settings)
    else:
        waypoints, sampled = _ompl_path(start, goal, scene, settings), True
        positions, velocities = time_path(waypoints, scene, settings)
    trajectory = PlannedTrajectory(scene.joint_names, waypoints, scene.limits.command_period_s, positions,
                                   velocities, 0.0, sampled)
    check_trajectory(trajectory, scene)
    return dataclasses.replace(trajectory, planning_s=time.perf_counter() - began)


MEASURED_SLACK = 0.01  # rad (m for the gripper): how far beyond a limit a measured start is taken as at it


def plan_from_measured(measured: Sequence[float], goal: Sequence[float], scene: PlanningScene,
                       settings: PlannerSettings = PlannerSettings()) -> PlannedTrajectory:
    """plan() from where the robot is measured: a joint resting at its limit (with margin)
    reads a hair beyond it, so a start within MEASURED_SLACK of the limits is taken as at
    them; one further out is what it is (PlanningError 'start_invalid')."""
    return plan(start_from_measured(measured, scene), goal, scene, settings)


def start_from_measured(measured: Sequence[float], scene: PlanningScene) -> np.ndarray:
    """The measured position with every joint within MEASURED_SLACK beyond a limit put at it."""
    measured = _joints(measured, scene, "start")
    near = (measured >= scene.lower - MEASURED_SLACK) & (measured <= scene.upper + MEASURED_SLACK)
    return np.where(near, np.clip(measured, scene.lower, scene.upper), measured)


def _joints(values: Sequence[float], scene: PlanningScene, what: str) -> np.ndarray:
    q = np.asarray(values, dtype=float).ravel()
    if q.shape != (len(scene.joint_names),):
        raise PlanningError("bad_request", f"the {what} has {q.size} joint values; give one per joint of "
                            f"{', '.join(scene.joint_names)}")
    if not np.all(np.isfinite(q)):
        raise PlanningError("bad_request", f"the {what} has a value that is not finite: {q.tolist()}")
    return q


def _motion_valid(scene: PlanningScene, a: np.ndarray, b: np.ndarray, resolution_rad: float) -> bool:
    steps = max(1, int(math.ceil(np.max(np.abs(b - a)) / resolution_rad)))
    return all(scene.valid(a + (b - a) * (k / steps)) for k in range(1, steps + 1))


def _ompl_path(start: np.ndarray, goal: np.ndarray, scene: PlanningScene, settings: PlannerSettings) -> np.ndarray:
    from ompl import base as ob
    from ompl import geometric as og
    from ompl import util as ou

    global _SEEDED
    ou.setLogLevel(ou.LogLevel.LOG_WARN)
    if settings.seed is not None and not _SEEDED:
        # OMPL seeds its samplers once per process (seed 0 means "choose one")
        ou.RNG.setSeed(int(settings.seed) + 1)
        _SEEDED = True
    n = len(scene.joint_names)
    space = ob.RealVectorStateSpace(n)
    bounds = ob.RealVectorBounds(n)
    for i in range(n):
        bounds.setLow(i, float(scene.lower[i]))
        bounds.setHigh(i, float(scene.upper[i]))
    space.setBounds(bounds)
    setup = og.SimpleSetup(space)
    setup.setStateValidityChecker(lambda state: scene.valid([state[i] for i in range(n)]))
    information = setup.getSpaceInformation()
    # OMPL's resolution is a fraction of the space's extent (its longest diagonal).
    information.setStateValidityCheckingResolution(settings.resolution_rad / space.getMaximumExtent())
    setup.setPlanner(getattr(og, settings.planner)(information))
    a, b = space.allocState(), space.allocState()
    for i in range(n):
        a[i], b[i] = float(start[i]), float(goal[i])
    setup.setStartAndGoalStates(a, b)
    for _ in range(settings.attempts):
        status = setup.solve(settings.time_limit_s)
        if setup.haveExactSolutionPath():
            break
        setup.clear()
    else:
        raise PlanningError("no_path", f"no collision-free path found in {settings.attempts} x "
                            f"{settings.time_limit_s:g} s ({status.asString() if hasattr(status, 'asString') else status});"
                            " the goal may be enclosed; try another goal or a longer time_limit_s")
    if settings.simplify:
        setup.simplifySolution(settings.simplify_s)
    path = setup.getSolutionPath()
    return np.array([[path.getState(k)[i] for i in range(n)] for k in range(path.getStateCount())])


def time_path(waypoints: np.ndarray, scene: PlanningScene, settings: PlannerSettings) -> tuple[np.ndarray, np.ndarray]:
    """Positions and velocities at the command period: rest to rest along each straight
    segment. Ruckig times the distance along the segment (one coordinate, jerk-limited) with
    the limits of the joint that binds first, so every sample lies on the checked line."""
    from ruckig import InputParameter, Result, Ruckig, Trajectory

    limits = scene.limits
    n, period = len(scene.joint_names), limits.command_period_s
    vmax = np.minimum(np.array(limits.velocity) * settings.velocity_fraction, settings.max_velocity_rad_s)
    amax = np.array(limits.acceleration) * settings.acceleration_fraction
    jmax = amax * settings.jerk_per_acceleration
    positions, velocities = [waypoints[0]], [np.zeros(n)]
    for a, b in zip(waypoints[:-1], waypoints[1:]):
        length = float(np.linalg.norm(b - a))
        if length == 0.0:
            continue
        direction = np.abs(b - a) / length
        moving = direction > 0
        request = InputParameter(1)
        request.current_position, request.target_position = [0.0], [length]
        request.max_velocity = [float(np.min(vmax[moving] / direction[moving]))]
        request.max_acceleration = [float(np.min(amax[moving] / direction[moving]))]
        request.max_jerk = [float(np.min(jmax[moving] / direction[moving]))]
        trajectory = Trajectory(1)
        result = Ruckig(1).calculate(request, trajectory)
        if result not in (Result.Working, Result.Finished):
            raise PlanningError("would_fault", f"ruckig could not time the segment ({result})")
        steps = max(1, int(math.ceil(trajectory.duration / period)))
        for k in range(1, steps + 1):
            distance, speed, _ = trajectory.at_time(min(k * period, trajectory.duration))
            positions.append(a + (b - a) * (distance[0] / length))
            velocities.append((b - a) * (speed[0] / length))
        positions[-1] = b.copy()
    return np.array(positions), np.array(velocities)


def monitor_problem(positions: np.ndarray, joint_names: Sequence[str], scene: PlanningScene,
                    period_s: float) -> str | None:
    """Why the envelope monitor would fault these targets, streamed one per `period_s` from
    the first with the robot following each; None when it would forward them all. Any
    command stream can be checked so before it is sent (`joint_names`: the targets' columns,
    a subset of the envelope's joints)."""
    monitor = EnvelopeMonitor(scene.limits, scene.kinematics)
    names = list(joint_names)
    monitor.on_joint_state(names, positions[0].tolist(), [], 0.0)
    refusal = monitor.arm()
    if refusal:
        return f"the envelope check could not start: {refusal}"
    for k in range(1, len(positions)):
        monitor.on_joint_state(names, positions[k - 1].tolist(), [], k * period_s)
        decision = monitor.check_command(names, positions[k].tolist(), k * period_s)
        if decision.violation is not None:
            return f"the envelope monitor would fault at {k * period_s:.3f} s: {decision.violation.reason}"
    return None


def check_trajectory(trajectory: PlannedTrajectory, scene: PlanningScene, *, collision_every: int = 5) -> None:
    """Refuse (PlanningError) a trajectory the envelope monitor would fault on, streamed as
    commands from its start with the robot following each target, or one that collides
    (checked every `collision_every` samples and at the end; the clearance is the planner's
    margin between checked states, so here only touching counts)."""
    q = trajectory.positions
    problem = monitor_problem(q, scene.joint_names, scene, trajectory.period_s)
    if problem is not None:
        raise PlanningError("would_fault", problem)
    for k in list(range(collision_every, len(q), collision_every)) + [len(q) - 1]:
        contact = scene.contact(q[k], clearance_m=0.0)  # limits and workspace: the monitor checked them
        if contact is not None:
            raise PlanningError("would_fault", f"the timed path leaves the checked one at "
                                f"{k * trajectory.period_s:.3f} s: collision {contact[0]}-{contact[1]}")


def solve_ik(scene: PlanningScene, position: Sequence[float], rotation: np.ndarray | None, seed: Sequence[float], *,
             restarts: int = 20, tolerance_m: float = 1e-4, tolerance_rad: float = 1e-3, rng_seed: int = 0) -> np.ndarray:
    """Joint positions (the scene's joint order; the finger keeps the seed's value) that put
    the tool centre point at `position` (m, world) with `rotation` (3x3; None: any), valid in
    the scene. Damped least squares on the twin's MuJoCo model from `seed`, then from random
    valid states; PlanningError 'ik_failed' when none converges to a valid state."""
    import mujoco

    position = np.asarray(position, dtype=float)
    model, data = scene.model, scene.data
    tcp = model.body("panda_hand_tcp").id
    arm = [i for i, j in enumerate(scene.joint_names) if model.joint(j).type == mujoco.mjtJoint.mjJNT_HINGE]
    dofs = np.array([model.joint(scene.joint_names[i]).dofadr[0] for i in arm])
    rng = np.random.default_rng(rng_seed)
    jacp, jacr = np.zeros((3, model.nv)), np.zeros((3, model.nv))
    seed = np.asarray(seed, dtype=float)
    fixed = [i for i in range(len(seed)) if i not in arm]
    best = math.inf
    for attempt in range(restarts + 1):
        q = seed.copy() if attempt == 0 else rng.uniform(scene.lower, scene.upper)
        q[fixed] = seed[fixed]
        for _ in range(200):
            scene.set(q)
            error = position - data.xpos[tcp]
            if rotation is not None:
                turn = np.zeros(3)
                quat_now, quat_goal, quat_err = np.zeros(4), np.zeros(4), np.zeros(4)
                mujoco.mju_mat2Quat(quat_now, data.xmat[tcp])
                mujoco.mju_mat2Quat(quat_goal, np.asarray(rotation, dtype=float).ravel())
                mujoco.mju_negQuat(quat_now, quat_now)
                mujoco.mju_mulQuat(quat_err, quat_goal, quat_now)
                mujoco.mju_quat2Vel(turn, quat_err, 1.0)
                error = np.concatenate([error, turn])
            small = np.linalg.norm(error[:3]) < tolerance_m and (rotation is None
                                                                 or np.linalg.norm(error[3:]) < tolerance_rad)
            if small:
                break
            mujoco.mj_comPos(model, data)  # the Jacobian reads the joint axes it places
            mujoco.mj_jacBody(model, data, jacp, jacr, tcp)
            jac = jacp[:, dofs] if rotation is None else np.vstack([jacp[:, dofs], jacr[:, dofs]])
            step = jac.T @ np.linalg.solve(jac @ jac.T + 1e-4 * np.eye(len(error)), error)
            q[arm] = np.clip(q[arm] + step, scene.lower[arm], scene.upper[arm])
        best = min(best, float(np.linalg.norm(error[:3])))
        if small and scene.valid(q):
            return q
    raise PlanningError("ik_failed", f"no valid joint positions put the tool at ({position[0]:.3f}, {position[1]:.3f}, "
                        f"{position[2]:.3f}) m (closest {best * 1000:.0f} mm away over {restarts + 1} starts): "
                        "the pose is out of reach, or every way to reach it collides or leaves the envelope")


def plan_to_pose(start: Sequence[float], position: Sequence[float], rotation: np.ndarray | None, scene: PlanningScene,
                 settings: PlannerSettings = PlannerSettings()) -> PlannedTrajectory:
    """plan() to the tool centre point pose (solve_ik seeded at `start`)."""
    start = _joints(start, scene, "start")
    return plan(start, solve_ik(scene, position, rotation, start), scene, settings)
