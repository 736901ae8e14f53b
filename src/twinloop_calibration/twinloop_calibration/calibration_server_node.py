"""Calibration action server: `~/calibrate` (twinloop_interfaces/action/Calibrate).

Live: plans diverse poses with the target in view, drives the arm there through the
envelope monitor (it arms the monitor, streams position targets to its input at the
monitor's command period without a break, holding while it takes images, and disarms it
after; a monitor fault ends the run with the monitor's reason), waits for the arm to
settle, and pairs the next camera image with the joint state at its stamp. Bag: reads the recorded views (twinloop_logging). Then solves (calibration.handeye),
writes `<calibration_root>/<workcell_name>/<camera>.yaml` and publishes the result on
/tf_static. All the work is in the pure modules; this node only moves data.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from rclpy.action import ActionServer, CancelResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from twinloop_ros.qos import COMMANDS, LATCHED, RELIABLE
from sensor_msgs.msg import CameraInfo, Image, JointState
from tf2_msgs.msg import TFMessage
from twinloop_interfaces.action import Calibrate
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode
from twinloop_interfaces.srv import SetArmed

from twinloop_calibration import calibration_io, handeye, se3, sources
from twinloop_calibration.degeneracy import CalibrationError, DegenerateData
from twinloop_calibration.intrinsics import calibrate_intrinsics, from_camera_info
from twinloop_calibration.live import JointBuffer, TargetStream, move_targets, stream_targets
from twinloop_calibration.pose_planner import PlannerLimits, PosePlanner
from twinloop_calibration.targets import TargetDetector, TargetNotFound, load_targets
from twinloop_ros.messages import image_to_numpy, tf_msg
from twinloop_ros.node import StartupError, declare, run_node
from twinloop_twin.kinematics import FrameTransform, UrdfTransforms
from twinloop_twin.physics import ARM_JOINTS
from twinloop_twin.workcell import default_config_dir, load_workcell



class CalibrationServer(Node):
    def __init__(self) -> None:
        super().__init__("calibration_server")
        self.p = declare(self, {
            "workcell_config": ("", "workcell YAML; empty: config/workcell.yaml"),
            "urdf": ("", "workcell URDF; empty: urdf/workcell.urdf"),
            "targets_file": ("", "calibration target descriptions; empty: config/calibration_targets.yaml"),
            "target": ("", "target name in targets_file; empty: its default"),
            "envelope_config": ("", "envelope monitor parameters bounding the planned poses; empty: config/envelope.yaml"),
            "calibration_root": ("calibration", "folder of calibration files; <root>/<workcell_name>/<camera>.yaml"),
            "workcell_name": ("emulated", "workcell name: subfolder of calibration_root"),
            "command_topic": ("/twinloop/calibration/command", "position targets: an input of the envelope monitor"),
            "command_period_s": (0.004, "s, period of the target stream; the monitor's command_period_s"),
            "monitor_node": ("/envelope_monitor", "envelope monitor armed for a live run; empty: command_topic "
                             "drives the robot directly (a cell without a monitor)"),
            "base_frame": ("world", "parent frame of eye-to-hand results and of the kinematics"),
            "gripper_frame": ("panda_hand", "parent frame of eye-in-hand results"),
            "child_frame_suffix": ("_calibrated", "published child frame = camera optical frame + suffix"),
            "anchor_camera": ("wrist_camera", "eye-to-hand with the cell's fixed target: the wrist camera that locates it"),
            "num_views": (12, "views to plan when the goal asks for 0"),
            "min_views": (5, "refuse fewer views than this"),
            "intrinsics_source": ("camera_info", "'camera_info' or 'calibrate' (from the same views)"),
            "max_joint_speed_rad_s": (0.6, "rad/s, peak joint speed of planned moves"),
            "settle_position_tolerance_rad": (0.003, "rad, settled when every joint is this near its target"),
            "settle_velocity_rad_s": (0.01, "rad/s, and slower than this"),
            "settle_time_s": (0.3, "s, for this long"),
            "move_timeout_s": (8.0, "s, a pose not settled by then is skipped"),
            "folds": (5, "k of the k-fold held-out residual"),
            "bootstrap": (20, "bootstrap resamples checking the covariance (0: none)"),
            "max_translation_std_m": (0.01, "m, refuse results less certain than this (1 sigma)"),
            "max_rotation_std_deg": (1.0, "deg, refuse results less certain than this (1 sigma)"),
            "planner_distance_m": ([0.30, 0.50], "m, camera-to-target distance range of planned views"),
            "planner_max_tilt_deg": (30.0, "deg, largest view angle from the target normal"),
            "seed": (0, "seed of the planner and of the k-fold split"),
        })
        try:
            self.workcell = load_workcell(self.p["workcell_config"] or None, self.p["urdf"] or None)
            targets, default = load_targets(self.p["targets_file"] or default_config_dir() / "calibration_targets.yaml")
            self.target = targets[self.p["target"] or default]
        except (OSError, ValueError, KeyError) as error:
            raise StartupError(f"cannot load the workcell or the calibration target: {error}") from error
        self.kinematics = UrdfTransforms(self.workcell.urdf_xml)
        self.detector = TargetDetector(self.target)
        self.joints = JointBuffer(list(ARM_JOINTS))
        self.images: dict[str, Image] = {}
        self.infos: dict[str, CameraInfo] = {}
        self.published: dict[str, FrameTransform] = {}
        group = ReentrantCallbackGroup()
        self.create_subscription(JointState, "/joint_states", self.on_joint_state, RELIABLE, callback_group=group)
        for camera in self.workcell.cameras:
            self.create_subscription(Image, f"/{camera}/color/image_raw",
                                     lambda m, c=camera: self.images.__setitem__(c, m), 2, callback_group=group)
            self.create_subscription(CameraInfo, f"/{camera}/color/camera_info",
                                     lambda m, c=camera: self.infos.__setitem__(c, m), 2, callback_group=group)
        self.command_pub = self.create_publisher(JointState, self.p["command_topic"], COMMANDS)
        self.monitor_status: EnvelopeStatus | None = None
        if self.p["monitor_node"]:
            self.arm_client = self.create_client(SetArmed, f"{self.p['monitor_node']}/set_armed", callback_group=group)
            self.create_subscription(EnvelopeStatus, "/twinloop/envelope/status",
                                     lambda m: setattr(self, "monitor_status", m), LATCHED, callback_group=group)
        self.stream: TargetStream | None = None
        self.tf_static_pub = self.create_publisher(TFMessage, "/tf_static", LATCHED)
        # Reentrant group + multi-threaded executor: joint states and images keep flowing
        # while a goal runs for a minute in its own thread.
        ActionServer(self, Calibrate, "~/calibrate", execute_callback=self.execute,
                     cancel_callback=lambda _: CancelResponse.ACCEPT, callback_group=group)

    def on_joint_state(self, msg: JointState) -> None:
        self.joints.add(msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec, msg.name, msg.position,
                        msg.velocity)

    def execute(self, goal_handle):
        result = Calibrate.Result()
        try:
            self.calibrate(goal_handle, goal_handle.request, result)
            result.error = ErrorCode(code=ErrorCode.NONE, message="")
            goal_handle.succeed()
        except (CalibrationError, TimeoutError) as error:
            code = getattr(error, "code", "TIMEOUT")
            result.error = ErrorCode(code=getattr(ErrorCode, code, ErrorCode.UNKNOWN), message=str(error))
            self.get_logger().error(f"calibration failed ({code}): {error}")
            goal_handle.canceled() if code == "CANCELED" else goal_handle.abort()
        except Exception as error:  # noqa: BLE001 - a goal must always end with a result that says why
            result.error = ErrorCode(code=ErrorCode.UNKNOWN, message=f"{type(error).__name__}: {error}")
            self.get_logger().error(f"calibration failed: {error!r}")
            goal_handle.abort()
        return result

    def calibrate(self, goal_handle, goal, result) -> None:
        setup = handeye.Setup(goal.setup) if goal.setup in ("eye_in_hand", "eye_to_hand") else None
        if setup is None or goal.camera not in self.workcell.cameras or goal.source not in ("live", "bag"):
            raise _error("INVALID_ARGUMENT", f"goal needs setup eye_in_hand|eye_to_hand (got {goal.setup!r}), a camera "
                         f"of {sorted(self.workcell.cameras)} (got {goal.camera!r}) and source live|bag (got {goal.source!r})")
        count = goal.num_views or self.p["num_views"]
        if count < self.p["min_views"]:
            raise DegenerateData(f"{count} views asked; at least {self.p['min_views']} are needed for a result "
                                 "that can be checked (num_views 0 uses the configured default)")
        options = handeye.Options(min_views=self.p["min_views"], folds=self.p["folds"], bootstrap=self.p["bootstrap"],
                                  max_translation_std_m=self.p["max_translation_std_m"],
                                  max_rotation_std_deg=self.p["max_rotation_std_deg"], seed=self.p["seed"])
        fixed_target = setup == handeye.Setup.EYE_TO_HAND
        moving_camera = self.p["anchor_camera"] if fixed_target else goal.camera
        if goal.source == "bag":
            if fixed_target:
                raise _error("INVALID_ARGUMENT", "eye_to_hand from a bag is not supported yet; calibrate live")
            bag = sources.views_from_bag(goal.bag_path, camera_name=goal.camera, detector=self.detector,
                                         joint_names=list(ARM_JOINTS), forward_kinematics=self._fk, setup=setup.value)
            views, cameras, static = bag.views, {goal.camera: bag.camera}, []
        else:
            views, cameras, static = self.collect(goal_handle, count, moving_camera, goal.camera if fixed_target else None)
        self._feedback(goal_handle, "solving", len(views), count, float("nan"))
        if fixed_target:
            solved, wrist = handeye.calibrate_static_camera_via_fixed_target(
                views, cameras[moving_camera], static, cameras[goal.camera], options)
            self._write(moving_camera, wrist, cameras[moving_camera], goal)
        else:
            solved = handeye.calibrate(setup, views, cameras[goal.camera], options)
        path = self._write(goal.camera, solved, cameras[goal.camera], goal)
        self.get_logger().info(calibration_io.report(solved, title=f"{goal.camera} calibration"))
        frame = self.published[goal.camera]
        result.transform = tf_msg([frame], self.get_clock().now().to_msg()).transforms[0]
        result.covariance = [float(v) for v in solved.covariance.ravel()]
        result.reprojection_rms_px, result.held_out_rms_px = solved.reprojection_rms_px, solved.held_out_rms_px
        result.views_used, result.views_rejected = solved.views_used, len(solved.rejected_views)
        result.calibration_path = str(path)

    def collect(self, goal_handle, count, moving_camera, static_camera):
        planner = self._planner(moving_camera)
        deadline = time.monotonic() + 30.0
        while self.joints.latest() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        latest = self.joints.latest()
        if latest is None:
            raise TimeoutError("no /joint_states received in 30 s: is the workcell (or robot driver) running?")
        start = dict(zip(ARM_JOINTS, latest[1]))
        plan = planner.plan(count, start, seed=self.p["seed"])
        with self._streaming(latest[1]):
            return self._visit(goal_handle, plan, moving_camera, static_camera)

    def _visit(self, goal_handle, plan, moving_camera, static_camera):
        views, static, detections = [], [], []
        for index, pose in enumerate(plan):
            if goal_handle.is_cancel_requested:
                raise _error("CANCELED", f"canceled after {len(views)} views")
            self._feedback(goal_handle, "moving", len(views), len(plan), float("nan"))
            target = np.array([pose.joint_positions[j] for j in ARM_JOINTS])
            if not self._move(target):
                self.get_logger().warning(f"pose {index} not reached within {self.p['move_timeout_s']} s; skipped")
                continue
            self._feedback(goal_handle, "detecting", len(views), len(plan), float("nan"))
            for camera in filter(None, (moving_camera, static_camera)):
                image = self._next_image(camera, time.time_ns())
                q = self.joints.at(image.header.stamp.sec * 1_000_000_000 + image.header.stamp.nanosec)
                try:
                    detection = self.detector.detect(image_to_numpy(image))
                except TargetNotFound as error:
                    self.get_logger().warning(f"pose {index}, {camera}: {error}")
                    continue
                if camera == moving_camera and q is not None:
                    views.append(handeye.View(self._fk(q), detection, label=str(index)))
                    detections.append(detection)
                elif camera == static_camera:
                    static.append(detection)
        cameras = {c: self._camera(c, detections if c == moving_camera else static)
                   for c in filter(None, (moving_camera, static_camera))}
        return views, cameras, static

    @contextmanager
    def _streaming(self, hold: np.ndarray):
        """Arm the monitor and stream targets (holding `hold` until a move) for the block;
        then disarm first (the monitor ignores what follows) and stop the stream."""
        self.stream = TargetStream(hold)
        stop = threading.Event()

        def publish(q: np.ndarray) -> None:
            msg = JointState(name=list(ARM_JOINTS), position=[float(v) for v in q])
            msg.header.stamp = self.get_clock().now().to_msg()
            self.command_pub.publish(msg)

        streamer = threading.Thread(target=stream_targets, args=(self.stream, publish, self.p["command_period_s"], stop),
                                    name="calibration_targets", daemon=True)
        streamer.start()
        try:
            time.sleep(0.1)  # a few holds first: the monitor's first step is referenced to the measurement
            self._set_armed(True)
            yield
        finally:
            try:
                self._set_armed(False)
            finally:
                stop.set()
                streamer.join()
                self.stream = None

    def _set_armed(self, armed: bool) -> None:
        if not self.p["monitor_node"]:
            return
        if not self.arm_client.wait_for_service(timeout_sec=5.0):
            if armed:
                raise _error("NOT_READY", f"no envelope monitor at {self.p['monitor_node']}: start it (live moves go "
                             "through it) or set monitor_node to '' on a cell without one")
            return
        future = self.arm_client.call_async(SetArmed.Request(armed=armed))
        deadline = time.monotonic() + 5.0
        while not future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        response = future.result() if future.done() else None
        if armed and (response is None or response.error.code != ErrorCode.NONE):
            why = response.error.message if response is not None else "no answer in 5 s"
            raise _error("ENVELOPE_VIOLATION", f"the envelope monitor refused to arm: {why}")

    def _check_monitor(self) -> None:
        status = self.monitor_status
        if self.p["monitor_node"] and status is not None and status.state == EnvelopeStatus.STATE_FAULT:
            raise _error("ENVELOPE_VIOLATION", f"the envelope monitor stopped the arm: {status.reason} "
                         "(reset it with ~/reset_fault after checking the cell, then calibrate again)")

    def _move(self, target: np.ndarray) -> bool:
        self.stream.follow(move_targets(self.stream.last, target, self.p["max_joint_speed_rad_s"],
                                        self.p["command_period_s"]))
        while not self.stream.idle():
            self._check_monitor()
            time.sleep(0.02)
        deadline = time.monotonic() + self.p["move_timeout_s"]
        while time.monotonic() < deadline:
            self._check_monitor()
            since = time.time_ns() - int(self.p["settle_time_s"] * 1e9)
            if self.joints.settled(target, since_ns=since, position_tolerance=self.p["settle_position_tolerance_rad"],
                                   velocity_tolerance=self.p["settle_velocity_rad_s"]):
                return True
            time.sleep(0.05)
        return False

    def _next_image(self, camera: str, after_ns: int, timeout_s: float = 5.0) -> Image:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            image = self.images.get(camera)
            if image is not None and image.header.stamp.sec * 1_000_000_000 + image.header.stamp.nanosec > after_ns:
                return image
            time.sleep(0.01)
        raise TimeoutError(f"no new image on /{camera}/color/image_raw within {timeout_s} s: is the camera running?")

    def _camera(self, camera: str, detections):
        if self.p["intrinsics_source"] == "calibrate":
            size = (self.workcell.cameras[camera].width, self.workcell.cameras[camera].height)
            return calibrate_intrinsics(detections, size)
        info = self.infos.get(camera)
        if info is None:
            raise TimeoutError(f"no /{camera}/color/camera_info received; set intrinsics_source to 'calibrate'")
        return from_camera_info(info.k, info.d, info.width, info.height)

    def _planner(self, camera: str) -> PosePlanner:
        home = self.workcell.home_joint_positions
        optical = self.workcell.cameras[camera].color_optical_frame
        gripper_T_camera = se3.inv(self._link(self.p["gripper_frame"], home)) @ self._link(optical, home)
        limits = PlannerLimits(distance_m=tuple(self.p["planner_distance_m"]), max_tilt_deg=self.p["planner_max_tilt_deg"])
        envelope = Path(self.p["envelope_config"]) if self.p["envelope_config"] else default_config_dir() / "envelope.yaml"
        if envelope.is_file():
            limits = sources.planner_limits_from_envelope(envelope, limits)
        intrinsics = self.workcell.cameras[camera]
        model = from_camera_info(np.array(intrinsics.camera_matrix).ravel(), [], intrinsics.width, intrinsics.height)
        return PosePlanner(self.kinematics.model, arm_joints=ARM_JOINTS, gripper_frame=self.p["gripper_frame"],
                           gripper_T_camera=gripper_T_camera, world_T_target=self._link(self.workcell.board.frame, home),
                           target_points=self.target.object_points(), camera=model, limits=limits)

    def _link(self, link: str, positions) -> np.ndarray:
        return self.kinematics.world_T_link(link, positions)

    def _fk(self, q: np.ndarray) -> np.ndarray:
        return self._link(self.p["gripper_frame"], dict(zip(ARM_JOINTS, q)))

    def _write(self, camera: str, solved, model, goal) -> Path:
        parent = self.p["gripper_frame"] if solved.setup == handeye.Setup.EYE_IN_HAND else self.p["base_frame"]
        child = self.workcell.cameras[camera].color_optical_frame + self.p["child_frame_suffix"]
        document = calibration_io.calibration_document(
            solved, camera_name=camera, parent_frame=parent, child_frame=child, camera=model,
            source={"mode": goal.source, "bag": goal.bag_path or None, "workcell": self.p["workcell_name"]})
        path = Path(self.p["calibration_root"]) / self.p["workcell_name"] / f"{camera}.yaml"
        calibration_io.write_calibration(path, document)
        self.published[camera] = FrameTransform(parent, child, solved.transform)
        self.tf_static_pub.publish(tf_msg(list(self.published.values()), self.get_clock().now().to_msg()))
        return path

    def _feedback(self, goal_handle, stage: str, collected: int, planned: int, residual: float) -> None:
        goal_handle.publish_feedback(Calibrate.Feedback(stage=stage, views_collected=collected, views_planned=planned,
                                                        current_residual_px=residual))


def _error(code: str, message: str) -> CalibrationError:
    error = CalibrationError(message)
    error.code = code
    return error


def main(args=None) -> None:
    run_node(CalibrationServer, args, executor=lambda: MultiThreadedExecutor(num_threads=4))


if __name__ == "__main__":
    main()
