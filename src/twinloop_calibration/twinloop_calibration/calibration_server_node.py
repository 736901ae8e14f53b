"""Calibration action server: `~/calibrate` (twinloop_interfaces/action/Calibrate).

Translates goals into twinloop_calibration.workcell_calibration (plan, live run or bag,
solve, write) and its result back into messages, publishes each result on /tf_static, and
serves as the live run's cell (twinloop_calibration.live.LiveCell): joint states and
images in, position targets out to the envelope monitor's input, the monitor armed and
disarmed through twinloop_ros.clients.EnvelopeClient.

Threads: one executor thread (the EventsExecutor where available) delivers the joint
states (500 Hz), the images and the monitor's answers; a goal runs in a worker thread
that execute (a coroutine) awaits (twinloop_ros.node.await_worker); the target stream has
a thread of its own. rclpy's MultiThreadedExecutor, used before, delivered 80 of the 500
joint states a second with a whole core (`python bench/executor_cost.py`): the settle
check starved and the target stream stalled past the monitor's watchdog on a loaded host.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from rclpy.action import ActionServer, CancelResponse
from rclpy.node import Node
from sensor_msgs.msg import CameraInfo, Image, JointState
from twinloop_interfaces.action import Calibrate
from twinloop_interfaces.msg import ErrorCode

from twinloop_calibration import handeye
from twinloop_calibration.degeneracy import CalibrationError
from twinloop_calibration.live import Frame, JointBuffer, LiveSettings, calibration_error
from twinloop_planning.execution import TargetStream, stream_targets
from twinloop_calibration.targets import TargetDetector, load_targets
from twinloop_calibration.workcell_calibration import CalibrationRequest, CalibrationSettings, WorkcellCalibration
from twinloop_ros.clients import ClientError, EnvelopeClient
from twinloop_ros.frames import FrameLookup, StaticFrames
from twinloop_ros.messages import image_to_numpy, tf_msg
from twinloop_ros.node import StartupError, await_worker, declare, make_executor, run_node
from twinloop_ros.qos import COMMANDS, RELIABLE
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
            "plan_moves": (True, "moves through the motion planner (collision-free in the workcell's scene and the "
                           "envelope); false: straight minimum-jerk moves"),
            "settle_position_tolerance_rad": (0.003, "rad, settled when every joint is this near its target"),
            "settle_velocity_rad_s": (0.01, "rad/s, and slower than this"),
            "settle_time_s": (0.3, "s, for this long"),
            "move_timeout_s": (8.0, "s, a pose not settled by then is skipped"),
            "image_timeout_s": (10.0, "s, wait for a camera's image at a pose (late: the view is skipped; "
                                "late twice in a row: the run ends)"),
            "folds": (5, "k of the k-fold held-out residual"),
            "bootstrap": (20, "bootstrap resamples checking the covariance (0: none)"),
            "max_translation_std_m": (handeye.MAX_TRANSLATION_STD_M, "m, refuse results less certain than this (1 sigma)"),
            "max_rotation_std_deg": (handeye.MAX_ROTATION_STD_DEG, "deg, refuse results less certain than this (1 sigma)"),
            "planner_distance_m": ([0.30, 0.50], "m, camera-to-target distance range of planned views"),
            "planner_max_tilt_deg": (30.0, "deg, largest view angle from the target normal"),
            "seed": (0, "seed of the planner and of the k-fold split"),
        })
        p = self.p
        try:
            workcell = load_workcell(p["workcell_config"] or None, p["urdf"] or None)
            targets, default = load_targets(p["targets_file"] or default_config_dir() / "calibration_targets.yaml")
            target = targets[p["target"] or default]
        except (OSError, ValueError, KeyError) as error:
            raise StartupError(f"cannot load the workcell or the calibration target: {error}") from error
        try:
            live = LiveSettings(**{k: p[k] for k in ("command_period_s", "max_joint_speed_rad_s", "plan_moves",
                                                     "settle_time_s",
                                                     "settle_position_tolerance_rad", "settle_velocity_rad_s",
                                                     "move_timeout_s", "image_timeout_s")})
        except ValueError as error:
            raise StartupError(f"live calibration parameters: {error}; fix config/calibration.yaml") from error
        settings = CalibrationSettings(**{k: p[k] for k in (
            "calibration_root", "workcell_name", "base_frame", "gripper_frame", "child_frame_suffix", "anchor_camera",
            "num_views", "min_views", "intrinsics_source", "folds", "bootstrap", "max_translation_std_m",
            "max_rotation_std_deg", "planner_max_tilt_deg", "envelope_config", "seed")},
            planner_distance_m=tuple(p["planner_distance_m"]), live=live)
        self.core = WorkcellCalibration(workcell, TargetDetector(target), settings, log=self.get_logger().info)
        self.joints = JointBuffer(list(ARM_JOINTS))
        self.images: dict[str, Image] = {}
        self.infos: dict[str, CameraInfo] = {}
        self.cameras = list(workcell.cameras)
        for camera in self.cameras:
            self.create_subscription(CameraInfo, f"/{camera}/color/camera_info",
                                     lambda m, c=camera: self.infos.__setitem__(c, m), 2)
        # Joint states (500 Hz) and images are taken only while a goal runs: deserialising
        # them between goals cost 60 % of a core here, taken from the robot's control path.
        self._listening: list = []
        # Commands: each message is one step of the monitor (the COMMANDS profile says why).
        self.command_pub = self.create_publisher(JointState, p["command_topic"], COMMANDS)
        self.envelope = EnvelopeClient(self, monitor=p["monitor_node"]) if p["monitor_node"] else None
        self._stream_stop = threading.Event()
        self._streamer: threading.Thread | None = None
        # Results out on /tf_static, the gripper's pose at each image from /tf: tf2_ros where
        # installed (twinloop_ros.frames); without it, forward kinematics of the joint states.
        self.static_frames = StaticFrames(self)
        self.frame_lookup = FrameLookup(self)
        self.get_logger().info(f"frames: results via {self.static_frames.via}; gripper poses "
                               + ("from tf2 (/tf)" if self.frame_lookup.available else
                                  "by forward kinematics of /joint_states (tf2_ros not installed)"))
        ActionServer(self, Calibrate, "~/calibrate", execute_callback=self.execute,
                     cancel_callback=lambda _: CancelResponse.ACCEPT)

    def on_joint_state(self, msg: JointState) -> None:
        self.joints.add(msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec, msg.name, msg.position,
                        msg.velocity)

    def _listen(self) -> None:
        """Subscribe to the joint states and images for the goal about to run."""
        self.joints = JointBuffer(list(ARM_JOINTS))
        self.images = {}
        self._listening = [self.create_subscription(JointState, "/joint_states", self.on_joint_state, RELIABLE)]
        for camera in self.cameras:
            self._listening.append(self.create_subscription(
                Image, f"/{camera}/color/image_raw", lambda m, c=camera: self.images.__setitem__(c, m), 2))

    def _stop_listening(self) -> None:
        for subscription in self._listening:
            self.destroy_subscription(subscription)
        self._listening = []
        self.images = {}

    async def execute(self, goal_handle):
        goal = goal_handle.request
        live = goal.source != "bag"
        if live:
            self._listen()
        try:
            return await await_worker(self, lambda: self._execute(goal_handle))
        finally:
            if live:
                self._stop_listening()

    def _execute(self, goal_handle):
        goal, result = goal_handle.request, Calibrate.Result()
        request = CalibrationRequest(goal.source, goal.camera, goal.setup, goal.num_views, goal.bag_path)
        try:
            outcome = self.core.calibrate(
                request, cell=self, camera_info=self.camera_info, cancelled=lambda: goal_handle.is_cancel_requested,
                feedback=lambda stage, views, planned: goal_handle.publish_feedback(Calibrate.Feedback(
                    stage=stage, views_collected=views, views_planned=planned, current_residual_px=float("nan"))))
        except (CalibrationError, TimeoutError) as error:
            code = getattr(error, "code", "TIMEOUT")
            result.error = ErrorCode(code=getattr(ErrorCode, code, ErrorCode.UNKNOWN), message=str(error))
            self.get_logger().error(f"calibration failed ({code}): {error}")
            goal_handle.canceled() if code == "CANCELED" else goal_handle.abort()
            return result
        except Exception as error:  # noqa: BLE001 - a goal must always end with a result that says why
            result.error = ErrorCode(code=ErrorCode.UNKNOWN, message=f"{type(error).__name__}: {error}")
            self.get_logger().error(f"calibration failed: {error!r}")
            goal_handle.abort()
            return result
        now = self.get_clock().now()
        self.static_frames.send(list(self.core.published.values()), now.nanoseconds)
        stamp = now.to_msg()
        solved = outcome.solved
        result.transform = tf_msg([outcome.frame], stamp).transforms[0]
        result.covariance = [float(v) for v in solved.covariance.ravel()]
        result.reprojection_rms_px, result.held_out_rms_px = solved.reprojection_rms_px, solved.held_out_rms_px
        result.views_used, result.views_rejected = solved.views_used, len(solved.rejected_views)
        result.calibration_path = str(outcome.path)
        result.error = ErrorCode(code=ErrorCode.NONE, message="")
        goal_handle.succeed()
        return result

    def camera_info(self, camera: str):
        info = self.infos.get(camera)
        return None if info is None else (info.k, info.d, info.width, info.height)

    # ---------------------------------------------------------------- the live run's cell
    def now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def start_stream(self, stream: TargetStream) -> None:
        def publish(q) -> None:
            msg = JointState(name=list(ARM_JOINTS), position=[float(v) for v in q])
            msg.header.stamp = self.get_clock().now().to_msg()
            self.command_pub.publish(msg)

        self._stream_stop.clear()
        self._streamer = threading.Thread(target=stream_targets, name="calibration_targets", daemon=True,
                                          args=(stream, publish, self.p["command_period_s"], self._stream_stop))
        self._streamer.start()

    def stop_stream(self) -> None:
        self._stream_stop.set()
        if self._streamer is not None:
            self._streamer.join()

    def arm(self) -> None:
        if self.envelope is None:
            return
        try:
            self.envelope.arm()
        except ClientError as error:
            if error.code == ErrorCode.NOT_READY:
                raise calibration_error("NOT_READY", f"no envelope monitor at {self.p['monitor_node']}: start it "
                                        "(live moves go through it) or set monitor_node to '' on a cell without "
                                        "one") from None
            raise calibration_error("ENVELOPE_VIOLATION", f"the envelope monitor refused to arm: {error}") from None

    def disarm(self) -> None:
        if self.envelope is not None:
            try:
                self.envelope.disarm()
            except ClientError as error:
                self.get_logger().warning(f"disarming the envelope monitor: {error}")

    def fault(self) -> str:
        return self.envelope.fault_text() if self.envelope is not None else ""

    def frame_pose(self, parent: str, child: str, stamp_ns: int) -> np.ndarray | None:
        return self.frame_lookup.lookup(parent, child, stamp_ns)

    def next_image(self, camera: str, after_ns: int, timeout_s: float) -> Frame:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            image = self.images.get(camera)
            if image is not None and image.header.stamp.sec * 1_000_000_000 + image.header.stamp.nanosec > after_ns:
                return Frame(image.header.stamp.sec * 1_000_000_000 + image.header.stamp.nanosec, image_to_numpy(image))
            time.sleep(0.01)
        raise TimeoutError(f"no new image on /{camera}/color/image_raw within {timeout_s} s: is the camera running?")


def main(args=None) -> None:
    run_node(CalibrationServer, args, executor=make_executor())


if __name__ == "__main__":
    main()
