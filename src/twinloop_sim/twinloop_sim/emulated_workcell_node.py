"""Emulated workcell: a stand-in for hardware behind the hardware contract.

MuJoCo runs the workcell in real time on hidden "true" physics (`truth_file`) that differ
from the nominal model, and the node exposes exactly what a real workcell exposes:
/joint_states (>= 500 Hz), /joint_command (position targets through the delayed actuator
model), /tf, /tf_static, latched /robot_description, and both RGB-D cameras (rendered by
a child process, see emulated_cameras_node). Other nodes cannot tell it from a robot
except by its name.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from tf2_msgs.msg import TFMessage
from twinloop_interfaces.msg import ErrorCode, SystemStatus
from twinloop_interfaces.srv import ResetWorkcell

from twinloop_sim.contract import CommandRejected, ContractTopics
from twinloop_sim.messages import joint_state_msg, stamp_from_ns, tf_msg
from twinloop_sim.node_support import (RateMeter, declare, load_sim_inputs, make_executor, run_node)
from twinloop_sim.scene_state import SceneStateWriter
from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.kinematics import UrdfTransforms

LATCHED = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL,
                     reliability=ReliabilityPolicy.RELIABLE)
# Reliable so that reliable subscribers (robot_state_publisher, recorders) match too.
STREAM = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
MAX_LAG_S = 0.1  # behind wall time by more than this: skip ahead instead of catching up


class EmulatedWorkcell(Node):
    def __init__(self) -> None:
        super().__init__("emulated_workcell")
        p = declare(self, {
            "truth_file": ("", "physics YAML with the hidden true parameters; empty: config/emulated_truth.yaml"),
            "workcell_config": ("", "workcell YAML; empty: config/workcell.yaml"),
            "urdf": ("", "workcell URDF; empty: urdf/workcell.urdf"),
            "seed": (0, "seed of every random draw (sensor noise)"),
            "joint_state_rate_hz": (500.0, "Hz, /joint_states and physics synchronisation rate"),
            "tf_rate_hz": (50.0, "Hz, /tf rate of the moving links"),
            "cameras_enabled": (True, "render and publish the RGB-D cameras (child process)"),
            "camera_rate_hz": (15.0, "Hz, rendered camera rate (declared below nominal on a CPU)"),
        })
        self.inputs = load_sim_inputs(p["truth_file"], p["workcell_config"], p["urdf"])
        self.sim = WorkcellSimulation(self.inputs.workcell, self.inputs.physics, seed=p["seed"])
        self.kinematics = UrdfTransforms(self.inputs.workcell.urdf_xml)
        topics = ContractTopics()

        self.joint_state_pub = self.create_publisher(JointState, topics.joint_states, STREAM)
        self.tf_pub = self.create_publisher(TFMessage, topics.tf, STREAM)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", STREAM)
        self.status_pub = self.create_publisher(SystemStatus, "~/status", LATCHED)
        self.create_publisher(String, topics.robot_description, LATCHED).publish(
            String(data=self.inputs.workcell.urdf_xml))
        self.create_publisher(TFMessage, topics.tf_static, LATCHED).publish(
            tf_msg(self.kinematics.static_transforms, self.get_clock().now().to_msg()))
        self.create_subscription(JointState, topics.joint_command, self.on_command, STREAM)
        self.create_service(ResetWorkcell, "~/reset", self.on_reset)

        self.scene_state = SceneStateWriter(self.sim.model.nq)
        self.joint_state_rate = RateMeter()
        self.commands_applied = 0
        self.commands_rejected = 0
        self.lag_skips = 0
        self._tf_every = max(1, round(p["joint_state_rate_hz"] / p["tf_rate_hz"]))
        self._tick = 0
        self._period_s = 1.0 / p["joint_state_rate_hz"]
        self._restart_clock()
        self.create_timer(self._period_s, self.on_tick)
        self.create_timer(1.0, self.publish_status)
        self.cameras = self._start_cameras(p) if p["cameras_enabled"] else None
        self.get_logger().info(
            f"emulated workcell up: truth '{self.inputs.physics_path}', "
            f"command delay {self.inputs.physics.command_delay_s * 1e3:.1f} ms, "
            f"joint states at {p['joint_state_rate_hz']:.0f} Hz, "
            f"cameras {'at %.0f Hz' % p['camera_rate_hz'] if self.cameras else 'off'}")

    def _start_cameras(self, p: dict) -> subprocess.Popen:
        args = [sys.executable, "-m", "twinloop_sim.emulated_cameras_node", "--ros-args",
                "-r", f"__ns:={self.get_namespace()}",
                "-p", f"scene_state:={self.scene_state.name}",
                "-p", f"truth_file:={self.inputs.physics_path}",
                "-p", f"workcell_config:={self.inputs.workcell.config_path}",
                "-p", f"urdf:={self.inputs.workcell.urdf_path}",
                "-p", f"seed:={p['seed'] + 1}",
                "-p", f"camera_rate_hz:={p['camera_rate_hz']}",
                "-p", f"parent_pid:={os.getpid()}"]
        return subprocess.Popen(args)

    def on_tick(self) -> None:
        # One sample per physics period, stamped with the wall time the state belongs to.
        # A tick that fires late publishes the periods it missed (with their own stamps)
        # instead of skipping them: a loaded host delays delivery, never the data.
        elapsed = time.monotonic() - self._wall_start
        if elapsed - self.sim.time_s > MAX_LAG_S:
            self.lag_skips += 1
            self._restart_clock()
            elapsed = self.sim.time_s
        while self.sim.time_s + self._period_s <= elapsed + 1e-9:
            self.sim.step_until(self.sim.time_s + self._period_s)
            self._publish_sample(self._epoch_ns + round(self.sim.time_s * 1e9))

    def _restart_clock(self) -> None:
        """Align simulated time with now (start, reset, or after a stall)."""
        self._wall_start = time.monotonic() - self.sim.time_s
        self._epoch_ns = time.time_ns() - round(self.sim.time_s * 1e9)

    def _publish_sample(self, stamp_ns: int) -> None:
        stamp = stamp_from_ns(stamp_ns)
        sample = self.sim.joint_state()
        self.joint_state_pub.publish(joint_state_msg(sample, stamp))
        self.joint_state_rate.tick()
        self.scene_state.write(self.sim.data.qpos, stamp_ns)
        self._tick += 1
        if self._tick % self._tf_every == 0:
            positions = dict(zip(sample.names, sample.position.tolist()))
            self.tf_pub.publish(tf_msg(self.kinematics.moving_transforms(positions), stamp))

    def on_command(self, msg: JointState) -> None:
        try:
            self.sim.command(msg.name, msg.position)
            self.commands_applied += 1
        except CommandRejected as error:
            self.commands_rejected += 1
            self.get_logger().error(f"rejected /joint_command: {error}", throttle_duration_sec=1.0)
            self.publish_diagnostic(DiagnosticStatus.ERROR, f"{error.code}: {error}")

    def on_reset(self, request: ResetWorkcell.Request, response: ResetWorkcell.Response):
        if len(request.joint_names) != len(request.joint_positions):
            response.error = ErrorCode(code=ErrorCode.INVALID_ARGUMENT,
                                       message="joint_names and joint_positions differ in length")
            return response
        try:
            self.sim.reset(dict(zip(request.joint_names, request.joint_positions)),
                           reset_box=request.reset_box)
        except CommandRejected as error:
            response.error = ErrorCode(code=getattr(ErrorCode, error.code), message=str(error))
            return response
        self._restart_clock()
        self.get_logger().info("workcell reset")
        response.error = ErrorCode(code=ErrorCode.NONE, message="")
        return response

    def publish_diagnostic(self, level: bytes, message: str) -> None:
        status = DiagnosticStatus(level=level, name=f"{self.get_name()}: joint_command",
                                  message=message, hardware_id="emulated_workcell")
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(array)

    def publish_status(self) -> None:
        msg = SystemStatus(component=self.get_name(), level=SystemStatus.LEVEL_OK, message="running")
        msg.header.stamp = self.get_clock().now().to_msg()
        if self.cameras is not None and self.cameras.poll() is not None:
            msg.level, msg.message = SystemStatus.LEVEL_ERROR, "camera process exited"
        msg.values = [KeyValue(key="joint_states_rate_hz", value=f"{self.joint_state_rate.rate_hz():.1f}"),
                      KeyValue(key="commands_applied", value=str(self.commands_applied)),
                      KeyValue(key="commands_rejected", value=str(self.commands_rejected)),
                      KeyValue(key="lag_skips", value=str(self.lag_skips)),
                      KeyValue(key="sim_time_s", value=f"{self.sim.time_s:.3f}")]
        self.status_pub.publish(msg)

    def destroy_node(self) -> None:
        if self.cameras is not None and self.cameras.poll() is None:
            self.cameras.terminate()
            try:
                self.cameras.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.cameras.kill()
        self.scene_state.close()
        super().destroy_node()


def main(args=None) -> None:
    run_node(EmulatedWorkcell, args, executor=make_executor())


if __name__ == "__main__":
    main()
