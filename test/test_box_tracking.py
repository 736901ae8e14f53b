"""Box tracking from the static camera against the emulated cell's ground truth.

The emulated workcell's own simulation plays pushes from five directions (the hand
passes over and beside the box, hiding up to all of it), under a truth drawn from a
seeded distribution; the static camera is rendered at 15 Hz with that truth's sensor
noise, and every frame goes through the tracker. Ground truth scores it; the tracker
reads only the frames, the camera's URDF mount and the workcell description.
"""
from __future__ import annotations

import os

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must precede `import mujoco`

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy.spatial.transform import Rotation  # noqa: E402

from twinloop_builder.excitation import (PushConfig, WorkspaceChecker, load_excitation_config,  # noqa: E402
                                         motion_limits, push_trajectory)
from twinloop_builder.synthetic import simulate_session  # noqa: E402
from twinloop_perception.box_tracking import (BoxTracker, BoxTrackerSettings, BoxTrackingError, Pinhole,  # noqa: E402
                                              box_symmetries, symmetric_rotation_error_rad)
from twinloop_perception.camera_pose import CameraPoseError, world_T_camera  # noqa: E402
from twinloop_sim.workcell_sim import CameraRig  # noqa: E402
from twinloop_twin.physics import load_physics  # noqa: E402
from twinloop_twin.scene import compile_workcell  # noqa: E402
from twinloop_twin.truth_draw import describe, draw_truth  # noqa: E402
from twinloop_twin.workcell import default_config_dir, load_workcell  # noqa: E402

FRAME_RATE_HZ = 15.0
EXTRA_PUSHES = [PushConfig(direction_deg=d, offset_m=0.0, distance_m=0.03, speed_m_s=0.25) for d in (180.0, 45.0)]


def track_pushes(workcell, truth, settings: BoxTrackerSettings, *, seed: int):
    camera = workcell.cameras["static_camera"]
    tracker = BoxTracker(settings, Pinhole(camera.width, camera.height, camera.fx, camera.fy, camera.cx, camera.cy),
                         world_T_camera(workcell, "static_camera"))
    model = compile_workcell(workcell, truth)
    checker = WorkspaceChecker(model, workcell.table_top_height_m)
    config = load_excitation_config(default_config_dir() / "excitation.yaml")
    max_speed, max_acceleration = motion_limits(config.joints, workcell.urdf_xml)
    pushes = [lambda box, p=p: push_trajectory(p, box, workcell.box.size_m[0] / 2, workcell.home_joint_positions,
                                               checker, max_speed=max_speed, max_acceleration=max_acceleration)
              for p in list(config.pushes) + EXTRA_PUSHES]
    rig = CameraRig(model, {"static_camera": camera}, truth.noise, seed=seed)
    frames = []
    due = [0.0]

    def on_chunk(sim) -> None:
        if sim.time_s + 1e-9 < due[0]:
            return
        due[0] += 1.0 / FRAME_RATE_HZ
        rig.set_state(sim.data.qpos)
        estimate = tracker.update(*rig.render("static_camera"))
        q = sim.box_qpos()
        frames.append((q[:3].copy(), Rotation.from_quat([q[4], q[5], q[6], q[3]]).as_matrix(), estimate))

    motion = simulate_session(workcell, truth, pushes, seed=seed, on_chunk=on_chunk)
    rig.close()
    return frames, motion


@pytest.fixture(scope="module")
def workcell():
    return load_workcell()


@pytest.fixture(scope="module")
def tracked(workcell):
    nominal = load_physics(default_config_dir() / "nominal_physics.yaml")
    truth = draw_truth(nominal, seed=41)
    print(f"truth draw seed 41:\n{describe(truth, nominal)}")
    settings = BoxTrackerSettings(size_m=tuple(workcell.box.size_m), table_height_m=workcell.table_top_height_m)
    return track_pushes(workcell, truth, settings, seed=41)


def _errors(frames, size_m):
    found = [(p, r, e) for p, r, e in frames if e.found]
    position = np.array([e.world_T_box[:3, 3] - p for p, _, e in found])
    rotation = np.array([symmetric_rotation_error_rad(e.world_T_box[:3, :3], r, size_m) for _, r, e in found])
    return found, position, rotation


def test_box_pose_within_the_accuracy_goal_while_the_arm_pushes_and_hides_it(tracked, workcell):
    frames, motion = tracked
    assert np.linalg.norm(motion.box_pose[-1, :2] - motion.box_pose[0, :2]) > 0.05  # the box moved
    found, position, rotation = _errors(frames, workcell.box.size_m)
    points = np.array([e.points for *_, e in frames])
    print(f"{len(found)} of {len(frames)} frames found; box points min {points.min()} median {np.median(points):.0f}")
    assert points.min() < 0.3 * np.median(points)  # the hand hid most of the box at times
    distance_mm = np.linalg.norm(position, axis=1) * 1e3
    angle_deg = np.degrees(rotation)
    print(f"position error median {np.median(distance_mm):.2f} mm, p95 {np.percentile(distance_mm, 95):.2f} mm, "
          f"max {distance_mm.max():.2f}; rotation error median {np.median(angle_deg):.2f} deg")
    # the goal: <= 3 mm and <= 2 deg median, p95 <= 6 mm
    assert np.median(distance_mm) <= 3.0 and np.median(angle_deg) <= 2.0
    assert np.percentile(distance_mm, 95) <= 6.0
    # and what it does here (0.06 mm, 0.16 deg median): per-pixel noise averages over ~3000 points
    assert np.median(distance_mm) <= 0.5 and np.median(angle_deg) <= 0.5
    assert len(found) >= 0.95 * len(frames)  # lost only while (nearly) hidden
    lost_points = [e.points for *_, e in frames if not e.found]
    assert all(n < 0.5 * np.median(points) for n in lost_points), lost_points


def test_covariance_95_percent_region_holds_at_least_90_percent_of_the_errors(tracked, workcell):
    frames, _ = tracked
    found, position, rotation_error = _errors(frames, workcell.box.size_m)
    chi2_3dof_95 = 7.815
    inside_position = [float(d @ np.linalg.solve(e.covariance[:3, :3], d)) <= chi2_3dof_95
                       for d, (_, _, e) in zip(position, found)]
    # rotation: the angle against the largest 95 % rotation bound of the covariance
    inside_rotation = [a <= np.sqrt(chi2_3dof_95 * np.linalg.eigvalsh(e.covariance[3:, 3:]).max())
                       for a, (_, _, e) in zip(rotation_error, found)]
    print(f"inside the 95 % region: position {np.mean(inside_position):.1%}, rotation {np.mean(inside_rotation):.1%}")
    assert np.mean(inside_position) >= 0.90
    assert np.mean(inside_rotation) >= 0.90


def test_geometry_only_tracking_without_the_color_gate(workcell):
    """Off the color gate: the search starts at the box's nominal place (the arm and the board
    stand above the table too); the goal holds on the configured pushes."""
    truth = load_physics(default_config_dir() / "emulated_truth.yaml")
    settings = BoxTrackerSettings(size_m=tuple(workcell.box.size_m), table_height_m=workcell.table_top_height_m,
                                  color_gate=False, initial_xy_m=tuple(workcell.box.world_position_m[:2]))
    frames, _ = track_pushes(workcell, truth, settings, seed=3)
    found, position, rotation = _errors(frames, workcell.box.size_m)
    distance_mm = np.linalg.norm(position, axis=1) * 1e3
    print(f"geometry only: {len(found)} of {len(frames)} found, median {np.median(distance_mm):.2f} mm, "
          f"p95 {np.percentile(distance_mm, 95):.2f} mm")
    assert np.median(distance_mm) <= 3.0 and np.percentile(distance_mm, 95) <= 6.0
    assert np.median(np.degrees(rotation)) <= 2.0


def test_cube_has_24_symmetries_and_the_error_ignores_them(workcell):
    symmetries = box_symmetries(workcell.box.size_m)
    assert len(symmetries) == 24
    assert len(box_symmetries((0.1, 0.06, 0.04))) == 4  # a brick: the identity and three half turns
    turn = Rotation.from_euler("z", 90, degrees=True).as_matrix()
    assert symmetric_rotation_error_rad(turn, np.eye(3), workcell.box.size_m) == pytest.approx(0.0, abs=1e-9)
    tilt = Rotation.from_euler("x", 5, degrees=True).as_matrix()
    assert np.degrees(symmetric_rotation_error_rad(tilt, np.eye(3), workcell.box.size_m)) == pytest.approx(5.0)


def test_bad_settings_inputs_and_calibration_files_say_what_is_wrong(workcell, tmp_path):
    with pytest.raises(BoxTrackingError, match="max_rms_m must be > 0"):
        BoxTrackerSettings(size_m=(0.06, 0.06, 0.06), table_height_m=0.75, max_rms_m=0.0)
    with pytest.raises(BoxTrackingError, match="finite"):
        BoxTrackerSettings(size_m=(0.06, float("nan"), 0.06), table_height_m=0.75)
    camera = workcell.cameras["static_camera"]
    tracker = BoxTracker(BoxTrackerSettings(size_m=(0.06,) * 3, table_height_m=0.75),
                         Pinhole(camera.width, camera.height, camera.fx, camera.fy, camera.cx, camera.cy), np.eye(4))
    with pytest.raises(BoxTrackingError, match="must both be 480x640"):
        tracker.update(np.zeros((240, 320, 3), np.uint8), np.zeros((240, 320), np.uint16))
    empty = tracker.update(np.zeros((480, 640, 3), np.uint8), np.zeros((480, 640), np.uint16))
    assert not empty.found and "0 box points in view" in empty.reason
    bad = tmp_path / "calibration.yaml"
    bad.write_text("transform: {translation_m: [0, 0], quaternion_xyzw: [0, 0, 0, 1]}\nparent_frame: world\n"
                   "setup: eye_to_hand\n")
    with pytest.raises(CameraPoseError, match="finite translation_m"):
        world_T_camera(workcell, "static_camera", bad)
    bad.write_text("transform: {translation_m: [0, 0, 1], quaternion_xyzw: [0, 0, 0, 1]}\nparent_frame: world\n"
                   "setup: eye_in_hand\n")
    with pytest.raises(CameraPoseError, match="needs an eye_to_hand one"):
        world_T_camera(workcell, "static_camera", bad)
    with pytest.raises(CameraPoseError, match="not a readable calibration file"):
        world_T_camera(workcell, "static_camera", tmp_path / "missing.yaml")


def test_calibrated_camera_pose_is_the_parent_frame_times_the_calibration(workcell, tmp_path):
    urdf_pose = world_T_camera(workcell, "static_camera")
    from twinloop_twin.kinematics import UrdfTransforms, matrix_to_quaternion_xyzw
    base = UrdfTransforms(workcell.urdf_xml).world_T_link("panda_link0", {})
    base_T_camera = np.linalg.inv(base) @ urdf_pose
    path = tmp_path / "static.yaml"
    path.write_text(f"setup: eye_to_hand\nparent_frame: panda_link0\ntransform:\n"
                    f"  translation_m: {base_T_camera[:3, 3].tolist()}\n"
                    f"  quaternion_xyzw: {list(matrix_to_quaternion_xyzw(base_T_camera[:3, :3]))}\n")
    np.testing.assert_allclose(world_T_camera(workcell, "static_camera", path), urdf_pose, atol=1e-9)
