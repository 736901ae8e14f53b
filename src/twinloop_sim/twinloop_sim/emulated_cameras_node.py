"""RGB-D cameras of a simulated workcell, rendered headless in their own process.

Started by the emulated workcell (or the sim bridge) with the name of the shared scene
state it writes; renders every camera of the workcell at `camera_rate_hz` and publishes
realsense-ros topics: `/<camera>/color/image_raw` (rgb8), `/<camera>/depth/image_rect_raw`
(16UC1, mm, aligned to color) and both camera_info topics, stamped with the time of the
physics state the frame shows. A camera none of whose topics has a subscriber is not
rendered, and frames with no camera to render count neither as delivered nor skipped (rendering is most of this process's CPU: ~26 ms a camera and frame at 640x480,
and the static camera's frames would wait behind the wrist camera's render). A frame that
cannot be rendered in time is skipped, not queued; the latched `~/status` says how many were skipped against `camera_rate_hz` and
the rate actually delivered (the workcell's status repeats it).
"""
from __future__ import annotations

import os
from collections import deque
from pathlib import Path

from diagnostic_msgs.msg import KeyValue
from rclpy.node import Node
from twinloop_ros.qos import IMAGES, LATCHED
from sensor_msgs.msg import CameraInfo, Image
from twinloop_interfaces.msg import SystemStatus

from twinloop_logging.drops import missing_periods

from twinloop_twin.contract import ContractTopics
from twinloop_ros.messages import camera_info_msg, image_msg, stamp_from_ns
from twinloop_ros.node import StartupError, declare, run_node
from twinloop_sim.inputs_node import load_sim_inputs
from twinloop_sim.scene_state import SceneStateReader
from twinloop_sim.workcell_sim import NO_NOISE, CameraRig
from twinloop_twin.bundle import load_twin
from twinloop_twin.nominal import load_scene, load_twin_workcell
from twinloop_twin.scene import compile_workcell



class EmulatedCameras(Node):
    def __init__(self) -> None:
        super().__init__("emulated_cameras")
        p = declare(self, {
            "scene_state": ("", "name of the shared scene-state block written by the physics node"),
            "truth_file": ("", "physics YAML (camera noise); empty: config/emulated_truth.yaml"),
            "twin_path": ("", "render this twin version's scene instead (noise-free); set by the sim bridge"),
            "workcell_config": ("", "workcell YAML; empty: config/workcell.yaml"),
            "urdf": ("", "workcell URDF; empty: urdf/workcell.urdf"),
            "seed": (1, "seed of the image noise"),
            "camera_rate_hz": (15.0, "Hz, rendered frame rate of every camera"),
            "parent_pid": (0, "exit when this process is gone (0: do not watch)"),
        })
        if not p["scene_state"]:
            raise StartupError("parameter scene_state is empty: this node is started by the "
                               "emulated workcell or the sim bridge, which pass it")
        if p["twin_path"]:
            twin = load_twin(Path(p["twin_path"]))
            model, cameras, noise = load_scene(twin), load_twin_workcell(twin).cameras, NO_NOISE
        else:
            inputs = load_sim_inputs(p["truth_file"], p["workcell_config"], p["urdf"])
            model = compile_workcell(inputs.workcell, inputs.physics)
            cameras, noise = inputs.workcell.cameras, inputs.physics.noise
        self.state = SceneStateReader(p["scene_state"])
        self.rig = CameraRig(model, cameras, noise, seed=p["seed"])
        self.parent_pid = p["parent_pid"]
        self.publishers_by_camera = {}
        for camera in self.rig.cameras:
            topics = ContractTopics.camera(camera)
            self.publishers_by_camera[camera] = {
                "color": self.create_publisher(Image, topics["color"], IMAGES),
                "depth": self.create_publisher(Image, topics["depth"], IMAGES),
                "color_info": self.create_publisher(CameraInfo, topics["color_info"], IMAGES),
                "depth_info": self.create_publisher(CameraInfo, topics["depth_info"], IMAGES),
            }
        self.declared_rate_hz = p["camera_rate_hz"]
        self.frames_delivered = self.frames_skipped = 0
        self._idle = False  # no camera had a subscriber at the last frame
        self._stamps_ns: deque[int] = deque(maxlen=max(2, round(5.0 * self.declared_rate_hz)))  # ~5 s
        self.status_pub = self.create_publisher(SystemStatus, "~/status", LATCHED)
        self.create_timer(1.0 / p["camera_rate_hz"], self.on_frame)
        self.create_timer(1.0, self.publish_status)

    def on_frame(self) -> None:
        if self.parent_pid and not _alive(self.parent_pid):
            self.get_logger().info("physics process is gone; stopping the cameras")
            raise SystemExit(0)
        snapshot = self.state.read()
        if snapshot is None:
            return
        qpos, stamp_ns, _ = snapshot
        wanted = [camera for camera, pubs in self.publishers_by_camera.items()
                  if any(pub.get_subscription_count() for pub in pubs.values())]
        if not wanted:
            self._idle = True  # nothing asked for, nothing skipped: the rate counts rendered frames
            return
        if self._idle:  # rendering again: the time nothing was asked for is not a gap
            self._stamps_ns.clear()
            self._idle = False
        # A render slower than the period delays the next timer call past whole periods:
        # those frames were never made (counted on the frames' own clock, the physics').
        if self._stamps_ns:
            self.frames_skipped += missing_periods(stamp_ns - self._stamps_ns[-1], 1e9 / self.declared_rate_hz)
        self._stamps_ns.append(stamp_ns)
        self.frames_delivered += 1
        self.rig.set_state(qpos)
        stamp = stamp_from_ns(stamp_ns)
        for camera in wanted:
            intrinsics, pubs = self.rig.cameras[camera], self.publishers_by_camera[camera]
            rgb, depth_mm = self.rig.render(camera)
            pubs["color"].publish(image_msg(rgb, "rgb8", intrinsics.color_optical_frame, stamp))
            pubs["color_info"].publish(camera_info_msg(intrinsics, intrinsics.color_optical_frame, stamp))
            pubs["depth"].publish(image_msg(depth_mm, "16UC1", intrinsics.depth_optical_frame, stamp))
            pubs["depth_info"].publish(camera_info_msg(intrinsics, intrinsics.depth_optical_frame, stamp))

    def publish_status(self) -> None:
        span_ns = self._stamps_ns[-1] - self._stamps_ns[0] if len(self._stamps_ns) > 1 else 0
        delivered = (len(self._stamps_ns) - 1) * 1e9 / span_ns if span_ns > 0 else 0.0  # on the frames' clock
        msg = SystemStatus(component=self.get_name(), level=SystemStatus.LEVEL_OK, message="rendering")
        if self.frames_delivered > 1 and delivered < 0.9 * self.declared_rate_hz:
            msg.level = SystemStatus.LEVEL_WARN
            msg.message = (f"cameras deliver {delivered:.1f} Hz of {self.declared_rate_hz:.1f} Hz declared "
                           f"({self.frames_skipped} frames skipped): rendering is slower than camera_rate_hz")
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.values = [KeyValue(key="camera_rate_hz_declared", value=f"{self.declared_rate_hz:.1f}"),
                      KeyValue(key="camera_rate_hz_delivered", value=f"{delivered:.1f}"),
                      KeyValue(key="camera_frames_delivered", value=str(self.frames_delivered)),
                      KeyValue(key="camera_frames_skipped", value=str(self.frames_skipped))]
        self.status_pub.publish(msg)

    def destroy_node(self) -> None:
        self.rig.close()
        self.state.close()
        super().destroy_node()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def main(args=None) -> None:
    run_node(EmulatedCameras, args)


if __name__ == "__main__":
    main()
