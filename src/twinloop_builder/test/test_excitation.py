"""Excitation trajectories (twinloop_builder.excitation): safe for the workcell and for the
envelope monitor's per-step checks, from home back to home."""
from __future__ import annotations

import numpy as np
import pytest

from twinloop_builder.excitation import (DEFAULT_ACCELERATION_LIMITS, ExcitationError, JointExcitationConfig,
                                         WorkspaceChecker, approach, joint_excitation, load_excitation_config,
                                         lift_trajectory, motion_limits, push_trajectory)
from twinloop_twin.physics import ARM_JOINTS, COMMANDED_JOINTS
from twinloop_twin.workcell import default_config_dir


def test_excitation_is_safe_and_starts_and_ends_at_home(workcell, spec, excitation):
    trajectory = excitation(10.0, 0)
    home = np.array([workcell.home_joint_positions[j] for j in trajectory.joints])
    assert np.allclose(trajectory.positions[0], home) and np.allclose(trajectory.positions[-1], home)
    model = spec.compile()
    low, high = model.jnt_range[[model.joint(j).id for j in ARM_JOINTS]].T
    arm = trajectory.positions[:, :7]
    assert np.all(arm >= low + 0.1) and np.all(arm <= high - 0.1)  # 0.15 rad margin configured
    speed = np.abs(np.diff(arm, axis=0)) / np.diff(trajectory.t)[:, None]
    assert np.all(speed <= 0.5 * 2.61 + 1e-6)  # half the URDF velocity limit
    assert np.all(np.ptp(arm, axis=0) > 0.3)  # and it does excite every arm joint
    checker = WorkspaceChecker(model, workcell.table_top_height_m)
    for row in trajectory.positions[::25]:
        assert not checker.violations(dict(zip(trajectory.joints, row)))
    # Per command step, as the envelope monitor checks it: accelerations within the limits
    # (config/envelope.yaml's, the excitation's defaults).
    accel = np.abs(np.diff(trajectory.positions, 2, axis=0)) / (trajectory.t[1] - trajectory.t[0]) ** 2
    limits = np.array([DEFAULT_ACCELERATION_LIMITS[j] for j in trajectory.joints])
    assert np.all(accel <= limits + 1e-6), (accel.max(0) / limits).round(2)


def test_approach_moves_from_the_measured_pose_within_limits(workcell, excitation):
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    trajectory = excitation(6.0, 0)
    home = dict(workcell.home_joint_positions)
    # At rest within noise of the start: nothing to add.
    assert approach({**home, "panda_joint1": home["panda_joint1"] + 1e-4}, trajectory, max_speed=max_speed,
                    max_acceleration=max_acceleration) is None
    # The gripper 0.4 mm short of its start (a 0.1 m/s step over 4 ms, the monitor's limit) and
    # joint 1 off by 0.1 rad: a smooth move there, the trajectory's first row right after it.
    start = {**home, "panda_finger_joint1": home["panda_finger_joint1"] - 4e-4, "panda_joint1": home["panda_joint1"]
             - 0.1}
    lead = approach(start, trajectory, max_speed=max_speed, max_acceleration=max_acceleration)
    joined = lead.then(trajectory).positions
    assert np.allclose(joined[0], [start[j] for j in trajectory.joints])
    dt = trajectory.t[1] - trajectory.t[0]
    assert np.all(np.abs(np.diff(joined, axis=0)).max(0) / dt <= [max_speed[j] + 1e-9 for j in trajectory.joints])
    assert np.all(np.abs(np.diff(joined, 2, axis=0)).max(0) / dt**2
                  <= [max_acceleration[j] + 1e-9 for j in trajectory.joints])


def _assert_home_to_home_within(path, home, max_speed, max_acceleration) -> None:
    """Per command step (as the envelope monitor checks them) within the limits, from home to home."""
    dt = path.t[1] - path.t[0]
    speed = np.abs(np.diff(path.positions, axis=0)).max(0) / dt
    accel = np.abs(np.diff(path.positions, 2, axis=0)).max(0) / dt**2
    assert np.all(speed <= [max_speed[j] + 1e-9 for j in path.joints]), speed
    assert np.all(accel <= [max_acceleration[j] + 1e-9 for j in path.joints]), accel
    assert np.allclose(path.positions[0], home) and np.allclose(path.positions[-1], home)


def test_pushes_keep_to_joint_speed_and_acceleration_limits(workcell, spec):
    """The pushes of config/excitation.yaml pass the envelope monitor's per-step checks:
    the IK tracks each step (no staircase) and segments too fast for the joints are slowed."""
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
    home = np.array([workcell.home_joint_positions[j] for j in COMMANDED_JOINTS])
    for push in config.pushes:
        path = push_trajectory(push, np.array(workcell.box.world_position_m), workcell.box.size_m[0] / 2,
                               workcell.home_joint_positions, checker, max_speed=max_speed,
                               max_acceleration=max_acceleration)
        _assert_home_to_home_within(path, home, max_speed, max_acceleration)
        assert path.slowed >= 1.0 and path.duration_s < 10.0
    # 0.35 m/s through the box is beyond what joint 2 can do here: that push is slowed.
    fast = push_trajectory(config.pushes[1], np.array(workcell.box.world_position_m), workcell.box.size_m[0] / 2,
                           workcell.home_joint_positions, checker, max_speed=max_speed,
                           max_acceleration=max_acceleration)
    assert fast.slowed > 1.5


def test_lifts_keep_to_the_limits_and_grip_the_box(workcell, spec):
    """The lifts of config/excitation.yaml pass the monitor's per-step checks (the fingers
    included), start and end at home, open around the box and close squeeze_m past its faces
    while the hand rises height_m above where it grasped."""
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    assert config.lifts
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
    home = np.array([workcell.home_joint_positions[j] for j in COMMANDED_JOINTS])
    box = np.array(workcell.box.world_position_m)
    half = workcell.box.size_m[0] / 2
    gripper = COMMANDED_JOINTS.index("panda_finger_joint1")
    for lift in config.lifts:
        path = lift_trajectory(lift, box, half, workcell.home_joint_positions, checker, max_speed=max_speed,
                               max_acceleration=max_acceleration)
        _assert_home_to_home_within(path, home, max_speed, max_acceleration)
        fingers = path.positions[:, gripper]
        assert fingers.min() == pytest.approx(half - lift.squeeze_m, abs=1e-9)
        heights = []
        for row in path.positions:
            checker.set(dict(zip(path.joints, row)))
            heights.append(checker.tcp_pose()[0][2])
        heights = np.array(heights)
        closed = fingers <= half - lift.squeeze_m + 1e-9
        grasp = heights[closed].min()
        assert grasp == pytest.approx(box[2], abs=1e-3)  # closed around the box's middle
        assert heights[closed].max() - grasp == pytest.approx(lift.height_m, abs=1e-3)
        held = np.sum(closed & (heights > grasp + lift.height_m - 1e-4)) * (path.t[1] - path.t[0])
        assert held >= lift.hold_s
        assert np.all(fingers[heights < grasp + 0.02] >= half - lift.squeeze_m - 1e-9)


def test_a_lift_the_gripper_would_pause_on_is_refused(tmp_path):
    raw = (default_config_dir() / "excitation.yaml").read_text()
    bad = tmp_path / "excitation.yaml"
    bad.write_text(raw.replace("squeeze_m: 0.03}", "squeeze_m: 0.05}"))
    with pytest.raises(ExcitationError, match="squeeze_m 0.05 must stay below the gripper's pause_lead"):
        load_excitation_config(bad)
    bad.write_text(raw.replace("hold_s: 1.5,", "hold_s: .nan,"))
    with pytest.raises(ExcitationError, match="lift 0: hold_s must be a finite number"):
        load_excitation_config(bad)


def test_unsafe_excitation_is_refused(workcell, spec, amplitude):
    config = JointExcitationConfig(duration_s=5.0, ramp_s=1.0, amplitude=amplitude, min_tcp_height_m=2.0)
    with pytest.raises(ExcitationError, match="lower the amplitudes"):
        joint_excitation(config, workcell.home_joint_positions, spec.compile(), workcell.urdf_xml,
                         workcell.table_top_height_m)


def test_excitation_file_loads():
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    assert config.joints.duration_s > 2 * config.joints.ramp_s and config.pushes


def test_scan_visits_every_view_held_still_within_the_limits(workcell, spec):
    from twinloop_builder.excitation import scan_trajectory, scan_view_positions

    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
    path = scan_trajectory(workcell.home_joint_positions, checker, max_speed=max_speed,
                           max_acceleration=max_acceleration, hold_s=1.0)
    dt = path.t[1] - path.t[0]
    speed = np.abs(np.diff(path.positions, axis=0)) / dt
    limit = np.array([max_speed[j] for j in COMMANDED_JOINTS])
    assert np.all(speed <= limit * (1 + 1e-9))
    home = np.array([workcell.home_joint_positions[j] for j in COMMANDED_JOINTS])
    np.testing.assert_allclose(path.positions[0], home)
    np.testing.assert_allclose(path.positions[-1], home)
    views = scan_view_positions(workcell.home_joint_positions)
    assert len(views) == 10
    for view in views[1:]:  # each view is held still for the hold time
        target = np.array([view[j] for j in COMMANDED_JOINTS])
        at = np.all(np.abs(path.positions - target) < 1e-12, axis=1)
        assert at.sum() * dt >= 1.0 - 1e-9, view
    with pytest.raises(ExcitationError, match="not reachable safely"):
        scan_trajectory(dict(workcell.home_joint_positions, panda_joint2=1.6), checker, max_speed=max_speed,
                        max_acceleration=max_acceleration)


def test_scan_moves_planned_by_the_motion_planner_pass_the_monitors_check(workcell, spec):
    """The scan as `twinloop build excite --kind scan` plays it: its moves between views are
    the planner's (twinloop_planning), and the whole scan passes the envelope monitor's own
    check; every view is still held for the hold time."""
    from twinloop_builder.excitation import scan_trajectory, scan_view_positions
    from twinloop_planning.planner import monitor_problem, plan
    from twinloop_planning.scene import PlanningScene

    scene = PlanningScene.from_workcell(workcell)
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    checker = WorkspaceChecker(spec.compile(), workcell.table_top_height_m)
    planned = []

    def plan_move(here, there):
        planned.append(plan(here, there, scene))
        return planned[-1].positions

    path = scan_trajectory(workcell.home_joint_positions, checker, max_speed=max_speed,
                           max_acceleration=max_acceleration, hold_s=0.5, plan_move=plan_move)
    views = scan_view_positions(workcell.home_joint_positions)
    assert len(planned) == len(views)  # every move, the last one home
    assert monitor_problem(path.positions, path.joints, scene, path.t[1] - path.t[0]) is None
    assert all(scene.contact(q, clearance_m=0.0) is None for q in path.positions[::25])
    for view in views[1:]:
        target = np.array([view[j] for j in COMMANDED_JOINTS])
        at = np.all(np.abs(path.positions - target) < 1e-12, axis=1)
        assert at.sum() * (path.t[1] - path.t[0]) >= 0.5 - 1e-9, view

    def refuse(here, there):
        raise ValueError("no path found")
    with pytest.raises(ExcitationError, match="the move to scan view 1 cannot be planned: no path found"):
        scan_trajectory(workcell.home_joint_positions, checker, max_speed=max_speed,
                        max_acceleration=max_acceleration, plan_move=refuse)
