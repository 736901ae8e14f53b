"""The planner on the emulated cell's nominal twin, with a keep-out column added to the
shipped envelope in front of the robot (config/envelope.yaml's only keep-out box, the
static camera's stand, lies outside the workspace). Pure core: no ROS."""
from __future__ import annotations

import numpy as np
import pytest

from twinloop_planning.planner import (PlannedTrajectory, PlannerSettings, PlanningError, check_trajectory,
                                       monitor_problem, plan, plan_to_pose, solve_ik)
from twinloop_planning.scene import PlanningScene
from twinloop_safety.envelope import write_envelope_with_keep_out
from twinloop_twin.motion import minimum_jerk
from twinloop_twin.nominal import build_nominal_twin
from twinloop_twin.workcell import default_config_dir, load_workcell

# xmin ymin zmin xmax ymax zmax (m): on the table, between the two poses below
COLUMN = [0.40, -0.06, 0.75, 0.60, 0.06, 1.25]
# The tool centre point 0.94 m high (19 cm over the table) at y = +0.26 and y = -0.33 m
LEFT = np.array([0.45, 0.3, 0.0, -2.5, 0.0, 3.6, 0.785398, 0.04])
RIGHT = np.array([-0.6, 0.3, 0.0, -2.5, 0.0, 3.6, 0.785398, 0.04])


def envelope_with_column(tmp_path):
    return write_envelope_with_keep_out(default_config_dir() / "envelope.yaml", tmp_path / "envelope.yaml",
                                        "column", COLUMN)


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planning")
    twin = build_nominal_twin(tmp / "twins", "emulated")
    return PlanningScene.from_twin(twin.path, envelope_with_column(tmp))


@pytest.fixture(scope="module")
def home(scene):
    positions = load_workcell().home_joint_positions
    return np.array([positions[j] for j in scene.joint_names])


def rates(trajectory: PlannedTrajectory) -> tuple[np.ndarray, np.ndarray]:
    """Peak |velocity| and |acceleration| per joint as the envelope monitor computes them
    (differences of successive targets over the command period)."""
    velocity = np.diff(trajectory.positions, axis=0) / trajectory.period_s
    acceleration = np.diff(velocity, axis=0) / trajectory.period_s
    return np.max(np.abs(velocity), axis=0), np.max(np.abs(acceleration), axis=0)


def test_a_clear_move_is_the_straight_line_timed_within_the_envelope(scene, home):
    goal = home + np.array([0.4, 0.2, -0.3, 0.3, 0.2, -0.2, 0.3, -0.02])
    trajectory = plan(home, goal, scene)
    assert not trajectory.sampled and len(trajectory.waypoints) == 2
    np.testing.assert_array_equal(trajectory.positions[0], home)
    np.testing.assert_array_equal(trajectory.positions[-1], goal)
    velocity, acceleration = rates(trajectory)
    limits = scene.limits
    # within 80 % of the limits (PlannerSettings), the acceleration to 2 % for sampling
    assert np.all(velocity <= 0.8 * np.array(limits.velocity) + 1e-9), velocity
    assert np.all(acceleration <= 0.8 * 1.02 * np.array(limits.acceleration)), acceleration
    # phase-synchronized: every sample on the segment (to 1 mrad)
    direction = (goal - home) / np.linalg.norm(goal - home)
    offsets = trajectory.positions - home
    off_line = offsets - np.outer(offsets @ direction, direction)
    assert np.max(np.linalg.norm(off_line, axis=1)) < 1e-3
    # the slowest joint sets the pace: the move lasts at least its distance over its speed
    assert trajectory.duration_s >= np.max(np.abs(goal - home) / (0.8 * np.array(limits.velocity)))
    capped = plan(home, goal, scene, PlannerSettings(max_velocity_rad_s=0.3))
    assert rates(capped)[0].max() <= 0.3 + 1e-9 and capped.duration_s > trajectory.duration_s


def test_a_path_around_the_keep_out_column(scene):
    assert scene.valid(LEFT) and scene.valid(RIGHT)
    # The straight move sweeps the hand through the column: the monitor's own check faults it.
    duration = 3.0
    steps = int(duration / scene.limits.command_period_s)
    straight = np.array([minimum_jerk(LEFT, RIGHT, duration, k * scene.limits.command_period_s)
                         for k in range(steps + 1)])
    with pytest.raises(PlanningError) as refused:
        check_trajectory(PlannedTrajectory(scene.joint_names, np.stack([LEFT, RIGHT]), scene.limits.command_period_s,
                                           straight, np.gradient(straight, axis=0), 0.0), scene)
    assert refused.value.code == "would_fault" and "column" in str(refused.value), str(refused.value)

    trajectory = plan(LEFT, RIGHT, scene, PlannerSettings(seed=3))
    assert trajectory.sampled and len(trajectory.waypoints) >= 3
    np.testing.assert_array_equal(trajectory.positions[-1], RIGHT)
    # Every commanded sample: no contact, every checked link's origin outside the grown column.
    column_min, column_max = np.array(COLUMN[:3]) - 0.02, np.array(COLUMN[3:]) + 0.02
    for q in trajectory.positions[::4]:
        assert scene.problem(q, clearance_m=0.0) is None
        links = scene.link_positions(q)
        assert not np.any(np.all((links >= column_min) & (links <= column_max), axis=1))
    velocity, acceleration = rates(trajectory)
    assert np.all(velocity <= 0.8 * np.array(scene.limits.velocity) + 1e-9)
    print(f"around the column: {len(trajectory.waypoints)} waypoints, path {trajectory.path_length_rad:.2f} rad "
          f"(straight {np.linalg.norm(RIGHT - LEFT):.2f}), {trajectory.duration_s:.1f} s, planned in "
          f"{trajectory.planning_s:.2f} s")


def test_a_cartesian_goal_is_reached_by_inverse_kinematics(scene, home):
    position, rotation = scene.tcp_pose(LEFT)
    trajectory = plan_to_pose(home, position, rotation, scene)
    reached, turned = scene.tcp_pose(trajectory.positions[-1])
    assert np.linalg.norm(reached - position) < 1e-3
    assert np.degrees(np.arccos(np.clip((np.trace(turned.T @ rotation) - 1) / 2, -1, 1))) < 0.5
    with pytest.raises(PlanningError) as far:
        solve_ik(scene, [1.6, 0.0, 1.0], None, home, restarts=3)
    assert far.value.code == "ik_failed" and "out of reach" in str(far.value)


def test_bad_starts_and_goals_are_refused_with_the_reason(scene, home):
    rng = np.random.default_rng(0)
    colliding = next(q for q in (rng.uniform(scene.lower, scene.upper) for _ in range(500))
                     if (scene.problem(q) or "").startswith("collision"))
    cases = [
        (colliding, home, "start_invalid", "collision"),
        (home, colliding, "goal_invalid", "collision"),
        (home, np.where(np.arange(8) == 3, 0.5, home), "goal_invalid", "panda_joint4=0.500 outside"),
        (home, home[:7], "bad_request", "one per joint"),
        (home, np.where(np.arange(8) == 0, np.nan, home), "bad_request", "not finite"),
    ]
    for start, goal, code, said in cases:
        with pytest.raises(PlanningError) as refused:
            plan(start, goal, scene)
        assert refused.value.code == code and said in str(refused.value), str(refused.value)
    with pytest.raises(PlanningError) as hurried:
        plan(LEFT, RIGHT, scene, PlannerSettings(time_limit_s=1e-4, attempts=1))
    assert hurried.value.code == "no_path"
    with pytest.raises(PlanningError) as unknown:
        PlannerSettings(planner="Dijkstra")
    assert unknown.value.code == "bad_request"


def test_a_trajectory_with_a_jump_would_fault_the_monitor(scene, home):
    positions = np.repeat(home[None], 20, axis=0)
    positions[10:, 0] += 0.05  # one 4 ms step of 50 mrad: 12.5 rad/s
    jump = PlannedTrajectory(scene.joint_names, positions[[0, -1]], scene.limits.command_period_s, positions,
                             np.zeros_like(positions), 0.0)
    with pytest.raises(PlanningError) as refused:
        check_trajectory(jump, scene)
    assert refused.value.code == "would_fault" and "velocity over the limit" in str(refused.value)


def test_any_command_stream_is_checked_before_it_is_sent(scene, home):
    """monitor_problem: the check `twinloop build excite` runs on each excitation, push and
    lift before it arms the monitor (a push planned for a box pushed beyond reach sagged 5 mm
    below the workspace floor and was faulted mid-push)."""
    period = scene.limits.command_period_s
    names = scene.joint_names
    low = np.array(LEFT)
    low[1] += 0.35  # the shoulder forward: the hand sinks to 0.75 m, below the floor (0.755 + 0.02 m margin)
    steps = 400
    down = np.array([minimum_jerk(LEFT, low, steps * period, k * period) for k in range(steps + 1)])
    tcp_low = scene.tcp_pose(low)[0][2]
    problem = monitor_problem(down, names, scene, period)
    floor = scene.limits.workspace.minimum[2] + scene.limits.cartesian_margin_m
    assert tcp_low < floor and problem is not None and "panda_hand_tcp would leave the workspace box" in problem
    fine = monitor_problem(down[:steps // 3], names, scene, period)  # the first third stays above it
    assert fine is None and scene.tcp_pose(down[steps // 3])[0][2] > floor, fine
    arm_only = [n for n in names if n != "panda_finger_joint1"]
    assert monitor_problem(down[:2, :7], arm_only, scene, period) is None  # a subset of the joints is fine


def test_a_measured_start_a_hair_beyond_a_limit_is_taken_at_it(scene, home):
    """A joint resting at its limit reads a little beyond it: within 10 mrad it is planned
    from the limit; further out the start is what it is, and refused."""
    from twinloop_planning.planner import plan_from_measured

    start = home.copy()
    start[6] = scene.upper[6] + 0.005  # panda_joint7 (the hand's turn) just past its upper limit with margin
    trajectory = plan_from_measured(start, home, scene)
    assert trajectory.positions[0][6] == scene.upper[6]
    np.testing.assert_allclose(trajectory.positions[-1], home)
    start[6] = scene.upper[6] + 0.05
    with pytest.raises(PlanningError) as refused:
        plan_from_measured(start, home, scene)
    assert refused.value.code == "start_invalid" and "panda_joint7" in str(refused.value)
