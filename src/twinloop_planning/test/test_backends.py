"""One interface, two backends: `plan()` with `backend: ompl` (OMPL + ruckig in the twin's
MuJoCo scene; runs everywhere) and `backend: moveit_py` (MoveIt 2's planning scene,
PlanningComponent and TOTG; runs where moveit_py and MoveIt's Panda configuration are
installed, skipped elsewhere: the ROS 2 wheels carry no MoveIt). The same test holds both to
the same contract: around the keep-out column, from the start to the goal, at the envelope's
command period, within 0.8 of its limits, forwarded by the monitor's own check, out of
contact; and a goal inside the column refused before any backend is asked.

Also the backend's pure parts that run here: the scene's obstacles as another collision
checker takes them, and the uniform re-timing within the envelope's limits."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from twinloop_planning.moveit_backend import AVAILABLE, config_package_path, retime_within_limits
from twinloop_planning.planner import PlannerSettings, PlanningError, monitor_problem, plan
from twinloop_planning.scene import PlanningScene, SceneSettings
from twinloop_twin.nominal import build_nominal_twin
from twinloop_twin.workcell import load_workcell

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_planner import COLUMN, LEFT, RIGHT, envelope_with_column  # noqa: E402

MOVEIT_CONFIG = PlannerSettings().moveit_config_package
MOVEIT_READY = AVAILABLE and config_package_path(MOVEIT_CONFIG) is not None
BACKENDS = ["ompl", pytest.param("moveit_py", marks=pytest.mark.skipif(
    not MOVEIT_READY, reason=f"moveit_py and {MOVEIT_CONFIG} are not installed (a ROS 2 install with MoveIt 2 has them)"))]


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backends")
    twin = build_nominal_twin(tmp / "twins", "emulated")
    return PlanningScene.from_twin(twin.path, envelope_with_column(tmp))


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_backends_plan_around_the_column_within_the_envelope(scene, backend):
    settings = PlannerSettings(backend=backend)
    trajectory = plan(LEFT, RIGHT, scene, settings)
    positions = trajectory.positions
    np.testing.assert_allclose(positions[0], LEFT, atol=1e-9)
    np.testing.assert_allclose(positions[-1], RIGHT, atol=1e-6)
    assert trajectory.period_s == scene.limits.command_period_s and trajectory.sampled
    velocity = np.max(np.abs(np.diff(positions, axis=0)), axis=0) / trajectory.period_s
    assert np.all(velocity <= 0.8 * np.array(scene.limits.velocity) * 1.001), velocity
    assert monitor_problem(positions, scene.joint_names, scene, trajectory.period_s) is None
    assert all(scene.contact(q, clearance_m=0.0) is None for q in positions[::10])
    # the hand went around the column: no checked link origin inside it at any sample
    lo, hi = np.array(COLUMN[:3]), np.array(COLUMN[3:])
    inside = [np.any(np.all((p >= lo) & (p <= hi), axis=1)) for p in map(scene.link_positions, positions[::10])]
    assert not any(inside)


@pytest.mark.parametrize("backend", BACKENDS)
def test_both_backends_refuse_a_goal_in_the_column_before_planning(scene, backend):
    assert scene.problem(LEFT) is None
    blocked = LEFT.copy()
    for q in np.linspace(LEFT, RIGHT, 41):  # a state on the straight line inside the column
        if scene.problem(q) is not None and "column" in scene.problem(q):
            blocked = q
            break
    with pytest.raises(PlanningError) as refused:
        plan(LEFT, blocked, scene, PlannerSettings(backend=backend))
    assert refused.value.code == "goal_invalid" and "column" in str(refused.value)


def test_an_unknown_backend_and_a_missing_moveit_are_bad_requests(scene):
    with pytest.raises(PlanningError, match="backend 'moveit' is not one of ompl, moveit_py"):
        PlannerSettings(backend="moveit")
    if not AVAILABLE:
        with pytest.raises(PlanningError, match="moveit_py is not installed") as refused:
            plan(LEFT, RIGHT, scene, PlannerSettings(backend="moveit_py"))
        assert refused.value.code == "bad_request"


def test_the_scene_obstacles_are_what_the_planner_avoids(scene):
    """What another checker (MoveIt's planning scene) is given: the table, the board, the box
    and both keep-out boxes, where the MuJoCo scene has them; no robot part."""
    obstacles = {o.name: o for o in scene.obstacles()}
    column = obstacles["keep_out/column"]
    assert column.kind == "box"
    np.testing.assert_allclose(column.size, np.subtract(COLUMN[3:], COLUMN[:3]), atol=1e-12)
    np.testing.assert_allclose(column.position, (np.add(COLUMN[3:], COLUMN[:3])) / 2, atol=1e-12)
    assert "keep_out/static_camera_stand" in obstacles
    table = next(o for name, o in obstacles.items() if name.startswith("table"))
    assert table.kind == "box" and abs(table.position[2] + table.size[2] / 2 - 0.75) < 1e-6  # the top at 0.75 m
    assert not any(name.startswith("panda") for name in obstacles)
    assert any(name.startswith("box/") for name in obstacles)
    workcell = load_workcell()
    allowed = PlanningScene.from_workcell(workcell, settings=SceneSettings(allowed=("box",))).obstacles()
    assert not any(o.name.startswith("box/") for o in allowed) and len(allowed) == len(obstacles) - 2  # no column


def test_retiming_keeps_the_path_and_brings_it_within_the_limits(scene):
    """A path timed too fast (2 s for a move the limits allow no faster than ~3 s) is slowed
    uniformly: the same positions in the same order, at the command period, within 0.8."""
    settings = PlannerSettings()
    times = np.linspace(0.0, 0.5, 26)
    s = 10 * (times / 0.5) ** 3 - 15 * (times / 0.5) ** 4 + 6 * (times / 0.5) ** 5
    path = LEFT + np.outer(s, RIGHT - LEFT)
    positions, velocities = retime_within_limits(times, path, scene, settings)
    period = scene.limits.command_period_s
    speed = np.max(np.abs(np.diff(positions, axis=0)), axis=0) / period
    accel = np.max(np.abs(np.diff(positions, 2, axis=0)), axis=0) / period**2
    assert np.all(speed <= 0.8 * np.array(scene.limits.velocity) + 1e-9)
    assert np.all(accel <= 0.8 * np.array(scene.limits.acceleration) + 1e-9)
    np.testing.assert_allclose(positions[0], LEFT)
    np.testing.assert_allclose(positions[-1], RIGHT)
    direction = (RIGHT - LEFT) / np.linalg.norm(RIGHT - LEFT)
    offsets = positions - LEFT
    assert np.max(np.linalg.norm(offsets - np.outer(offsets @ direction, direction), axis=1)) < 1e-9  # on the path
    assert (len(positions) - 1) * period > 0.5 and velocities.shape == positions.shape
