"""Calibrating one workcell's cameras, as the calibration server does it, without ROS: the
request checked, the views collected (a live run on a `LiveCell`, or a bag), the hand-eye
solve, the calibration file written and the frame to publish.

Pure Python (no rclpy). The node translates goals into `CalibrationRequest`s and results
back into messages; it publishes `WorkcellCalibration.published` on /tf_static.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from twinloop_calibration import calibration_io, handeye, se3, sources
from twinloop_calibration.degeneracy import DegenerateData
from twinloop_calibration.intrinsics import CameraModel, calibrate_intrinsics, from_camera_info
from twinloop_calibration.live import LiveCell, LiveRun, LiveSettings, calibration_error
from twinloop_calibration.pose_planner import PlannerLimits, PosePlanner
from twinloop_calibration.targets import TargetDetector
from twinloop_planning.planner import PlannerSettings, PlanningError, plan_from_measured
from twinloop_planning.scene import PlanningScene
from twinloop_twin.kinematics import FrameTransform, UrdfTransforms
from twinloop_twin.physics import ARM_JOINTS
from twinloop_twin.workcell import WorkcellDescription, default_config_dir

CameraInfo = tuple[Sequence[float], Sequence[float], int, int]  # K (row-major), D, width, height


@dataclass(frozen=True)
class CalibrationSettings:
    calibration_root: str = "calibration"
    workcell_name: str = "emulated"
    base_frame: str = "world"
    gripper_frame: str = "panda_hand"
    child_frame_suffix: str = "_calibrated"
    anchor_camera: str = "wrist_camera"
    num_views: int = 12
    min_views: int = 5
    intrinsics_source: str = "camera_info"  # or "calibrate"
    folds: int = 5
    bootstrap: int = 20
    max_translation_std_m: float = handeye.MAX_TRANSLATION_STD_M
    max_rotation_std_deg: float = handeye.MAX_ROTATION_STD_DEG
    planner_distance_m: tuple[float, float] = (0.30, 0.50)
    planner_max_tilt_deg: float = 30.0
    envelope_config: str = ""  # empty: config/envelope.yaml
    seed: int = 0
    live: LiveSettings = LiveSettings()


@dataclass(frozen=True)
class CalibrationRequest:
    source: str  # live | bag
    camera: str
    setup: str  # eye_in_hand | eye_to_hand
    num_views: int = 0  # 0: settings.num_views
    bag_path: str = ""


@dataclass(frozen=True)
class CalibrationOutcome:
    solved: handeye.HandEyeResult
    camera: CameraModel
    path: Path
    frame: FrameTransform


@dataclass
class WorkcellCalibration:
    workcell: WorkcellDescription
    detector: TargetDetector
    settings: CalibrationSettings = CalibrationSettings()
    log: Callable[[str], None] = lambda message: None
    published: dict[str, FrameTransform] = field(default_factory=dict)  # camera -> calibrated frame

    def __post_init__(self) -> None:
        self.kinematics = UrdfTransforms(self.workcell.urdf_xml)
        self._move_scene: PlanningScene | None = None

    def calibrate(self, request: CalibrationRequest, *, cell: LiveCell | None = None,
                  camera_info: Callable[[str], CameraInfo | None] = lambda camera: None,
                  cancelled: Callable[[], bool] = lambda: False,
                  feedback: Callable[[str, int, int], None] = lambda stage, views, planned: None) -> CalibrationOutcome:
        """Raises CalibrationError (its `code` names the ErrorCode) or TimeoutError."""
        s = self.settings
        setup = handeye.Setup(request.setup) if request.setup in ("eye_in_hand", "eye_to_hand") else None
        if setup is None or request.camera not in self.workcell.cameras or request.source not in ("live", "bag"):
            raise calibration_error("INVALID_ARGUMENT", (
                f"goal needs setup eye_in_hand|eye_to_hand (got {request.setup!r}), a camera of "
                f"{sorted(self.workcell.cameras)} (got {request.camera!r}) and source live|bag (got {request.source!r})"))
        count = request.num_views or s.num_views
        if count < s.min_views:
            raise DegenerateData(f"{count} views asked; at least {s.min_views} are needed for a result "
                                 "that can be checked (num_views 0 uses the configured default)")
        options = handeye.Options(min_views=s.min_views, folds=s.folds, bootstrap=s.bootstrap,
                                  max_translation_std_m=s.max_translation_std_m,
                                  max_rotation_std_deg=s.max_rotation_std_deg, seed=s.seed)
        fixed_target = setup == handeye.Setup.EYE_TO_HAND
        moving = s.anchor_camera if fixed_target else request.camera
        if request.source == "bag":
            if fixed_target:
                raise calibration_error("INVALID_ARGUMENT", "eye_to_hand from a bag is not supported yet; calibrate live")
            bag = sources.views_from_bag(request.bag_path, camera_name=request.camera, detector=self.detector,
                                         joint_names=list(ARM_JOINTS), forward_kinematics=self.fk, setup=setup.value)
            views, cameras, static = bag.views, {request.camera: bag.camera}, []
        else:
            if cell is None:
                raise calibration_error("NOT_READY", "a live calibration needs the cell (robot, cameras, monitor)")
            run = LiveRun(cell, self.detector, self.fk, s.live, log=self.log,
                          plan_move=self.move_planner() if s.live.plan_moves else None,
                          frames=(s.base_frame, s.gripper_frame))
            start = dict(zip(ARM_JOINTS, run.first_joint_state()))
            plan = self.planner(moving).plan(count, start, seed=s.seed)
            poses = [np.array([p.joint_positions[j] for j in ARM_JOINTS]) for p in plan]
            live = run.collect(poses, moving, request.camera if fixed_target else None, cancelled=cancelled,
                               feedback=feedback)
            views, static = live.views, live.detections.get(request.camera, []) if fixed_target else []
            cameras = {c: self.camera_model(c, d, camera_info(c)) for c, d in live.detections.items()}
        feedback("solving", len(views), count)
        if fixed_target:
            solved, wrist = handeye.calibrate_static_camera_via_fixed_target(
                views, cameras[moving], static, cameras[request.camera], options)
            self.write(moving, wrist, cameras[moving], request)
        else:
            solved = handeye.calibrate(setup, views, cameras[request.camera], options)
        path = self.write(request.camera, solved, cameras[request.camera], request)
        self.log(calibration_io.report(solved, title=f"{request.camera} calibration"))
        return CalibrationOutcome(solved, cameras[request.camera], path, self.published[request.camera])

    def camera_model(self, camera: str, detections, info: CameraInfo | None) -> CameraModel:
        if self.settings.intrinsics_source == "calibrate":
            intrinsics = self.workcell.cameras[camera]
            return calibrate_intrinsics(detections, (intrinsics.width, intrinsics.height))
        if info is None:
            raise TimeoutError(f"no /{camera}/color/camera_info received; set intrinsics_source to 'calibrate'")
        return from_camera_info(*info)

    def planner(self, camera: str) -> PosePlanner:
        s, home = self.settings, self.workcell.home_joint_positions
        optical = self.workcell.cameras[camera].color_optical_frame
        gripper_T_camera = se3.inv(self.link(s.gripper_frame, home)) @ self.link(optical, home)
        limits = PlannerLimits(distance_m=tuple(s.planner_distance_m), max_tilt_deg=s.planner_max_tilt_deg)
        envelope = Path(s.envelope_config) if s.envelope_config else default_config_dir() / "envelope.yaml"
        if envelope.is_file():
            limits = sources.planner_limits_from_envelope(envelope, limits)
        intrinsics = self.workcell.cameras[camera]
        model = from_camera_info(np.array(intrinsics.camera_matrix).ravel(), [], intrinsics.width, intrinsics.height)
        return PosePlanner(self.kinematics.model, arm_joints=ARM_JOINTS, gripper_frame=s.gripper_frame,
                           gripper_T_camera=gripper_T_camera, world_T_target=self.link(self.workcell.board.frame, home),
                           target_points=self.detector.spec.object_points(), camera=model, limits=limits)

    def move_planner(self) -> Callable[[np.ndarray, np.ndarray], list[np.ndarray]]:
        """Arm moves through the motion planner: collision-free in the workcell's scene and the
        envelope, at most live.max_joint_speed_rad_s, checked by the monitor's code before
        they are sent. The gripper is not commanded here: it is taken as at its home."""
        s = self.settings
        if self._move_scene is None:
            envelope = Path(s.envelope_config) if s.envelope_config else default_config_dir() / "envelope.yaml"
            self._move_scene = PlanningScene.from_workcell(self.workcell, envelope)
        scene = self._move_scene
        held = np.array([self.workcell.home_joint_positions[j] for j in scene.joint_names])
        arm = [scene.joint_names.index(j) for j in ARM_JOINTS]
        settings = PlannerSettings(max_velocity_rad_s=s.live.max_joint_speed_rad_s, seed=s.seed)

        def plan_move(start: np.ndarray, goal: np.ndarray) -> list[np.ndarray]:
            a, b = held.copy(), held.copy()
            a[arm], b[arm] = start, goal
            try:
                trajectory = plan_from_measured(a, b, scene, settings)  # where the last move ended
            except PlanningError as error:
                raise ValueError(str(error)) from error
            return list(trajectory.positions[1:, arm])
        return plan_move

    def link(self, link: str, positions: Mapping[str, float]) -> np.ndarray:
        return self.kinematics.world_T_link(link, positions)

    def fk(self, q: np.ndarray) -> np.ndarray:
        """base_T_gripper at arm joint positions q (ARM_JOINTS order)."""
        return self.link(self.settings.gripper_frame, dict(zip(ARM_JOINTS, q)))

    def write(self, camera: str, solved: handeye.HandEyeResult, model: CameraModel, request: CalibrationRequest) -> Path:
        s = self.settings
        parent = s.gripper_frame if solved.setup == handeye.Setup.EYE_IN_HAND else s.base_frame
        child = self.workcell.cameras[camera].color_optical_frame + s.child_frame_suffix
        document = calibration_io.calibration_document(
            solved, camera_name=camera, parent_frame=parent, child_frame=child, camera=model,
            source={"mode": request.source, "bag": request.bag_path or None, "workcell": s.workcell_name})
        path = Path(s.calibration_root) / s.workcell_name / f"{camera}.yaml"
        calibration_io.write_calibration(path, document)
        self.published[camera] = FrameTransform(parent, child, solved.transform)
        return path
