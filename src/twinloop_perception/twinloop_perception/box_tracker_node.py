"""Box tracker node: the box's pose from the static camera's color + depth, at the camera's rate.

Subscribes to a camera's realsense-ros topics (color, aligned depth, camera_info), pairs
color and depth frames by stamp, and publishes for every pair:
- `/twinloop/perception/box_pose` geometry_msgs/PoseWithCovarianceStamped in `world`,
  stamped with the image's time (only when the box is found);
- `~/status` twinloop_interfaces/SystemStatus (latched): found or lost with the reason,
  the frames tracked and lost, the latency from image stamp to publish (the camera's own
  delay included) and the tracker's own processing time;
- `~/markers` visualization_msgs/MarkerArray: the tracked box in RViz.
The camera's pose in `world` comes from the URDF mount, or from an eye-to-hand
calibration file (`calibration_file`, written by `twinloop calibrate`) when given.
Parameters: config/box_tracker.yaml.
"""
from __future__ import annotations

import os
import time

import numpy as np
from diagnostic_msgs.msg import KeyValue
from geometry_msgs.msg import PoseWithCovarianceStamped
from rclpy.node import Node
from rclpy.time import Time
from sensor_msgs.msg import CameraInfo, Image
from twinloop_interfaces.msg import SystemStatus
from visualization_msgs.msg import Marker, MarkerArray

from twinloop_perception.box_tracking import BoxTracker, BoxTrackerSettings, BoxTrackingError, Pinhole
from twinloop_perception.camera_pose import CameraPoseError, world_T_camera
from twinloop_ros.messages import image_to_numpy
from twinloop_ros.node import StartupError, declare, run_node
from twinloop_ros.qos import IMAGES, LATCHED, RELIABLE
from twinloop_twin.contract import TRACKED_BOX_POSE_TOPIC, ContractTopics
from twinloop_twin.kinematics import matrix_to_quaternion_xyzw
from twinloop_twin.workcell import ExampleRobotDataMissing, WorkcellConfigError, load_workcell

WORLD_FRAME = "world"


class BoxTrackerNode(Node):
    def __init__(self) -> None:
        super().__init__("box_tracker")
        defaults = BoxTrackerSettings(size_m=(1.0, 1.0, 1.0), table_height_m=0.0)
        p = declare(self, {
            "camera": ("static_camera", "camera whose color + aligned depth are tracked (workcell.yaml name)"),
            "workcell_config": ("", "workcell YAML (box size, table height); empty: config/workcell.yaml"),
            "urdf": ("", "workcell URDF (the camera's mount); empty: urdf/workcell.urdf"),
            "calibration_file": ("", "eye-to-hand calibration of this camera; empty: the URDF mount"),
            "color_gate": (defaults.color_gate, "keep only pixels of the box's color (HSV)"),
            "hue_deg": (defaults.hue_deg, "deg, the box's hue"),
            "hue_tolerance_deg": (defaults.hue_tolerance_deg, "deg"),
            "min_saturation": (defaults.min_saturation, "0-1"),
            "min_value": (defaults.min_value, "0-1"),
            "search_radius_m": (defaults.search_radius_m, "m, around the last estimate while tracking"),
            "min_points": (defaults.min_points, "fewer box points: lost"),
            "max_rms_m": (defaults.max_rms_m, "m, a worse fit: lost"),
            "covariance_scale": (defaults.covariance_scale, "variance multiplier measured against ground truth"),
            "position_std_floor_m": (defaults.position_std_floor_m, "m"),
            "rotation_std_floor_rad": (defaults.rotation_std_floor_rad, "rad"),
            "nice": (10, "niceness added to this process (0: the control path's priority)"),
        })
        if int(p["nice"]) > 0:
            # perception must not take the CPU from the control path (workcell, envelope monitor,
            # command senders) on a loaded host: late frames are skipped, a late command faults
            os.nice(int(p["nice"]))
        try:
            workcell = load_workcell(p["workcell_config"] or None, p["urdf"] or None)
            if p["camera"] not in workcell.cameras:
                raise StartupError(f"camera '{p['camera']}' is not in the workcell; cameras: {sorted(workcell.cameras)}")
            self.intrinsics = workcell.cameras[p["camera"]]
            self.world_T_camera = world_T_camera(workcell, p["camera"], p["calibration_file"] or None)
            settings = BoxTrackerSettings(
                size_m=tuple(workcell.box.size_m), table_height_m=workcell.table_top_height_m,
                **{k: p[k] for k in ("color_gate", "hue_deg", "hue_tolerance_deg", "min_saturation", "min_value",
                                     "search_radius_m", "min_points", "max_rms_m", "covariance_scale",
                                     "position_std_floor_m", "rotation_std_floor_rad")})
        except (WorkcellConfigError, ExampleRobotDataMissing, CameraPoseError, BoxTrackingError) as error:
            raise StartupError(str(error)) from error
        self.settings = settings
        self.tracker: BoxTracker | None = None
        self.pending: dict[str, dict[int, Image]] = {"color": {}, "depth": {}}
        self.counts = {"found": 0, "lost": 0}
        self.was_found = False
        self.latencies_s: list[float] = []  # image stamp to publish (the camera's own delay included)
        self.processing_s: list[float] = []  # the tracker's own share: frame received to pose out
        topics = ContractTopics.camera(p["camera"])
        self.create_subscription(Image, topics["color"], lambda m: self.on_image("color", m), IMAGES)
        self.create_subscription(Image, topics["depth"], lambda m: self.on_image("depth", m), IMAGES)
        self.create_subscription(CameraInfo, topics["color_info"], self.on_info, IMAGES)
        # pose: every estimate counts (identification reads them), hence reliable
        self.pose_pub = self.create_publisher(PoseWithCovarianceStamped, TRACKED_BOX_POSE_TOPIC, RELIABLE)
        self.status_pub = self.create_publisher(SystemStatus, "~/status", LATCHED)
        self.marker_pub = self.create_publisher(MarkerArray, "~/markers", RELIABLE)
        self.get_logger().info(f"tracking the box from {p['camera']} ({topics['color']}, {topics['depth']}); "
                               f"camera pose from {p['calibration_file'] or 'the URDF mount'}")

    def on_info(self, msg: CameraInfo) -> None:
        if self.tracker is None:
            k = msg.k
            self.tracker = BoxTracker(self.settings, Pinhole(msg.width, msg.height, k[0], k[4], k[2], k[5]),
                                      self.world_T_camera)

    def on_image(self, kind: str, msg: Image) -> None:
        stamp = Time.from_msg(msg.header.stamp).nanoseconds
        other = self.pending["depth" if kind == "color" else "color"]
        if stamp not in other:
            self.pending[kind] = {s: m for s, m in self.pending[kind].items() if s > stamp - 1_000_000_000}
            self.pending[kind][stamp] = msg
            return
        pair = {kind: msg, "depth" if kind == "color" else "color": other.pop(stamp)}
        if self.tracker is not None:
            self.track(pair["color"], pair["depth"])

    def track(self, color: Image, depth: Image) -> None:
        started = time.perf_counter()
        try:
            estimate = self.tracker.update(image_to_numpy(color), image_to_numpy(depth))
        except BoxTrackingError as error:
            self.publish_status(SystemStatus.LEVEL_ERROR, str(error))
            return
        latency_s = (self.get_clock().now() - Time.from_msg(color.header.stamp)).nanoseconds * 1e-9
        self.latencies_s = (self.latencies_s + [latency_s])[-100:]
        self.processing_s = (self.processing_s + [time.perf_counter() - started])[-100:]
        if not estimate.found:
            self.counts["lost"] += 1
            if self.counts["lost"] % 15 == 1 or self.was_found:
                self.publish_status(SystemStatus.LEVEL_WARN, f"lost: {estimate.reason}")
            self.was_found = False
            return
        self.counts["found"] += 1
        msg = PoseWithCovarianceStamped()
        msg.header.stamp, msg.header.frame_id = color.header.stamp, WORLD_FRAME
        position, rotation = estimate.world_T_box[:3, 3], estimate.world_T_box[:3, :3]
        msg.pose.pose.position.x, msg.pose.pose.position.y, msg.pose.pose.position.z = map(float, position)
        o = msg.pose.pose.orientation
        o.x, o.y, o.z, o.w = matrix_to_quaternion_xyzw(rotation)
        msg.pose.covariance = [float(v) for v in estimate.covariance.ravel()]
        self.pose_pub.publish(msg)
        self.marker_pub.publish(self.marker(msg))
        was_found, self.was_found = self.was_found, True
        if self.counts["found"] % 15 == 1 or not was_found:
            std = np.sqrt(np.diag(estimate.covariance))
            self.publish_status(SystemStatus.LEVEL_OK, f"found: {estimate.points} points, fit rms "
                                f"{estimate.rms_m * 1e3:.1f} mm, 1-sigma {std[:3].max() * 1e3:.1f} mm / "
                                f"{np.degrees(std[3:].max()):.1f} deg")

    def marker(self, pose: PoseWithCovarianceStamped) -> MarkerArray:
        marker = Marker(header=pose.header, ns="box_tracker", id=0, type=Marker.CUBE, action=Marker.ADD)
        marker.pose = pose.pose.pose
        marker.scale.x, marker.scale.y, marker.scale.z = map(float, self.settings.size_m)
        marker.color.r, marker.color.g, marker.color.b, marker.color.a = 0.1, 0.8, 0.2, 0.6
        return MarkerArray(markers=[marker])

    def publish_status(self, level: int, message: str) -> None:
        msg = SystemStatus(component=self.get_name(), level=level, message=message)
        msg.header.stamp = self.get_clock().now().to_msg()
        latency = np.percentile(self.latencies_s, [50, 95]) if self.latencies_s else (float("nan"),) * 2
        processing = np.percentile(self.processing_s, 50) if self.processing_s else float("nan")
        msg.values = [KeyValue(key="frames_found", value=str(self.counts["found"])),
                      KeyValue(key="frames_lost", value=str(self.counts["lost"])),
                      KeyValue(key="latency_ms_median", value=f"{latency[0] * 1e3:.1f}"),
                      KeyValue(key="latency_ms_p95", value=f"{latency[1] * 1e3:.1f}"),
                      KeyValue(key="processing_ms_median", value=f"{processing * 1e3:.1f}")]
        self.status_pub.publish(msg)


def main(args=None) -> None:
    run_node(BoxTrackerNode, args)


if __name__ == "__main__":
    main()
