"""The pose planner against the workcell's kinematics: reachable, in view, in limits, diverse."""
from __future__ import annotations

import numpy as np

from twinloop_calibration import se3
from twinloop_calibration.degeneracy import rotation_diversity
from twinloop_calibration.intrinsics import CameraModel
from twinloop_calibration.pose_planner import PlannerLimits, PosePlanner
from twinloop_calibration.sources import planner_limits_from_envelope
from twinloop_calibration.targets import load_targets
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.physics import ARM_JOINTS
from twinloop_twin.workcell import default_config_dir, load_workcell


def test_planned_poses_are_reachable_visible_and_diverse():
    workcell = load_workcell()
    kinematics = UrdfTransforms(workcell.urdf_xml)
    home = workcell.home_joint_positions
    intrinsics = workcell.cameras["wrist_camera"]
    gripper_T_camera = se3.inv(kinematics.world_T_link("panda_hand", home)) @ kinematics.world_T_link(
        intrinsics.color_optical_frame, home)
    targets, default = load_targets(default_config_dir() / "calibration_targets.yaml")
    limits = planner_limits_from_envelope(default_config_dir() / "envelope.yaml", PlannerLimits())
    planner = PosePlanner(kinematics.model, arm_joints=ARM_JOINTS, gripper_frame="panda_hand",
                          gripper_T_camera=gripper_T_camera,
                          world_T_target=kinematics.world_T_link(workcell.board.frame, home),
                          target_points=targets[default].object_points(),
                          camera=CameraModel(np.array(intrinsics.camera_matrix), np.zeros(5), 640, 480), limits=limits)
    poses = planner.plan(12, home, seed=1)
    assert len(poses) == 12
    for pose in poses:
        # FK at the planned joints (independently, through UrdfTransforms) puts the target in view
        world_T_gripper = kinematics.world_T_link("panda_hand", pose.joint_positions)
        np.testing.assert_allclose(world_T_gripper, pose.world_T_gripper, atol=1e-6)
        assert planner.visible(world_T_gripper @ gripper_T_camera)
        q = np.array([pose.joint_positions[j] for j in ARM_JOINTS])
        assert np.all(q >= planner.lower) and np.all(q <= planner.upper)
        assert np.all(world_T_gripper[:3, 3] >= limits.workspace_min_m)
        assert np.all(world_T_gripper[:3, 3] <= limits.workspace_max_m)
    spread = rotation_diversity([p.world_T_gripper for p in poses]).rotation_spread_deg
    # Diverse: at least 5 deg of orientation spread about each of two axes (hand-eye needs two).
    assert spread[1] > 5.0, spread
