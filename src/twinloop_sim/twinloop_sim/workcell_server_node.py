"""A simulated workcell served over the hardware contract: the shared core of the emulated
workcell (truth physics + sensor noise, wall clock) and the sim bridge (a twin version,
simulated clock). Subclasses only say where the model comes from.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
from rclpy.node import Node
from twinloop_ros.qos import LATCHED, STREAM
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from tf2_msgs.msg import TFMessage
from twinloop_interfaces.msg import ErrorCode, SystemStatus
from twinloop_interfaces.srv import ResetWorkcell

from twinloop_twin.contract import APPLIED_COMMAND_SUFFIX, BOX_POSE_SUFFIX, CommandRejected, ContractTopics
from twinloop_ros.messages import joint_state_msg, stamp_from_ns, tf_msg
from twinloop_ros.node import RateMeter, declare
from twinloop_sim.scene_state import SceneStateWriter
from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.kinematics import UrdfTransforms

# Behind wall time by more than this: skip ahead instead of catching up. Up to it, a stall of
# the process (a loaded host) is caught up, sample by sample, so stamps never jump.
MAX_LAG_S = 1.0
FAST_BATCH_S = 0.05  # simulated seconds per callback when running as fast as possible

COMMON_PARAMETERS = {
    "seed": (0, "seed of every random draw (sensor noise, posterior samples)"),
    "joint_state_rate_hz": (500.0, "Hz, /joint_states and physics synchronisation rate"),
    "tf_rate_hz": (50.0, "Hz, /tf rate of the moving links"),
    "cameras_enabled": (True, "render and publish the RGB-D cameras (child process)"),
    "camera_rate_hz": (15.0, "Hz, rendered camera rate (declared below nominal on a CPU)"),
    "camera_nice": (10, "niceness added to the camera process (0: the control path's priority)"),
}


@dataclass(frozen=True)
class ServedModel:
    sim: WorkcellSimulation
    urdf_xml: str
    camera_parameters: dict[str, str]  # how the camera process finds the same model
    description: str  # for the log: what is being served


class WorkcellServer(Node):
    """Serves `ServedModel` over the contract; `simulated_clock` switches /clock on."""

    def __init__(self, node_name: str, parameters: dict, *, simulated_clock: bool) -> None:
        super().__init__(node_name)
        self.p = declare(self, {**COMMON_PARAMETERS, **parameters})
        self.simulated_clock = simulated_clock
        self.real_time = self.p.get("real_time", True)
        self.served = self.load_model(self.p)
        self.sim = self.served.sim
        self.kinematics = UrdfTransforms(self.served.urdf_xml)
        topics = ContractTopics()

        self.joint_state_pub = self.create_publisher(JointState, topics.joint_states, STREAM)
        self.tf_pub = self.create_publisher(TFMessage, topics.tf, STREAM)
        self.clock_pub = self.create_publisher(Clock, topics.clock, STREAM) if simulated_clock else None
        # under /twinloop/ so that the recording profiles (identification, trial) keep it
        self.box_pose_pub = self.create_publisher(PoseStamped, f"/twinloop/{node_name}{BOX_POSE_SUFFIX}", STREAM)
        # Each accepted command, stamped with the physics time it takes effect at: on a
        # loaded host the recorder's receive time can be ms off; replay and identification
        # use this when a recording has it (a real driver has no such topic).
        self.applied_pub = self.create_publisher(JointState, f"/twinloop/{node_name}{APPLIED_COMMAND_SUFFIX}", STREAM)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", STREAM)
        self.status_pub = self.create_publisher(SystemStatus, "~/status", LATCHED)
        self.create_publisher(String, topics.robot_description, LATCHED).publish(String(data=self.served.urdf_xml))
        self.tf_static_pub = self.create_publisher(TFMessage, topics.tf_static, LATCHED)
        self.create_subscription(JointState, topics.joint_command, self.on_command, STREAM)
        self.create_service(ResetWorkcell, "~/reset", self.on_reset)

        self.scene_state = SceneStateWriter(self.sim.model.nq)
        self.joint_state_rate = RateMeter()
        self.commands_applied = 0
        self.commands_rejected = 0
        self.lag_skips = 0
        self._period_s = 1.0 / self.p["joint_state_rate_hz"]
        self._tf_every = max(1, round(self.p["joint_state_rate_hz"] / self.p["tf_rate_hz"]))
        self._tick = 0
        self._last_clock_ns = 0
        self._restart_clock()
        self.tf_static_pub.publish(tf_msg(self.kinematics.static_transforms, self._stamp()))
        self.create_timer(self._period_s if self.real_time else 0.001, self.on_tick)
        self.create_timer(1.0, self.publish_status)
        self.cameras = self._start_cameras() if self.p["cameras_enabled"] else None
        # What the camera process delivered against camera_rate_hz, repeated in ~/status.
        self.camera_status: SystemStatus | None = None
        if self.cameras is not None:
            self.create_subscription(SystemStatus, f"{self._cameras_node_name()}/status",
                                     lambda msg: setattr(self, "camera_status", msg), LATCHED)
        self.get_logger().info(
            f"{node_name} up: {self.served.description}; joint states at {self.p['joint_state_rate_hz']:.0f} Hz "
            f"({'real time' if self.real_time else 'as fast as possible'}, "
            f"{'simulated /clock' if simulated_clock else 'wall clock'}), "
            f"cameras {'at %.0f Hz' % self.p['camera_rate_hz'] if self.cameras else 'off'}")

    def load_model(self, p: dict) -> ServedModel:
        raise NotImplementedError

    # ---------------------------------------------------------------- time
    def _restart_clock(self) -> None:
        """Align simulated time with now (start, reset, or after a stall)."""
        self._wall_start = time.monotonic() - self.sim.time_s
        if self.simulated_clock:
            # A reset rewinds the physics, never the clock: /clock must not jump back.
            self._clock_offset_ns = self._last_clock_ns - round(self.sim.time_s * 1e9)
        else:
            self._epoch_ns = time.time_ns() - round(self.sim.time_s * 1e9)

    def _now_ns(self) -> int:
        base = self._clock_offset_ns if self.simulated_clock else self._epoch_ns
        return base + round(self.sim.time_s * 1e9)

    def _stamp(self) -> Time:
        return stamp_from_ns(self._now_ns())

    def on_tick(self) -> None:
        # One sample per physics period, stamped with the time the state belongs to. A tick
        # that fires late publishes the periods it missed, with their own stamps: a loaded
        # host delays delivery, never the data.
        if self.real_time:
            target = time.monotonic() - self._wall_start
            if target - self.sim.time_s > MAX_LAG_S:
                self.lag_skips += 1
                self._restart_clock()
                target = self.sim.time_s
        else:
            target = self.sim.time_s + FAST_BATCH_S
        while self.sim.time_s + self._period_s <= target + 1e-9:
            self.sim.step_until(self.sim.time_s + self._period_s)
            self._publish_sample(self._now_ns())

    def _publish_sample(self, stamp_ns: int) -> None:
        stamp = stamp_from_ns(stamp_ns)
        if self.clock_pub is not None:
            self.clock_pub.publish(Clock(clock=stamp))
            self._last_clock_ns = stamp_ns
        sample = self.sim.joint_state()
        self.joint_state_pub.publish(joint_state_msg(sample, stamp))
        self.joint_state_rate.tick()
        self.scene_state.write(self.sim.data.qpos, stamp_ns)
        self._tick += 1
        if self._tick % self._tf_every == 0:
            positions = dict(zip(sample.names, sample.position.tolist()))
            self.tf_pub.publish(tf_msg(self.kinematics.moving_transforms(positions), stamp))
            self.box_pose_pub.publish(self._box_pose(stamp))

    def _box_pose(self, stamp: Time) -> PoseStamped:
        """Ground truth of the simulation (a real workcell has none; perception would)."""
        x, y, z, qw, qx, qy, qz = self.sim.box_qpos().tolist()
        msg = PoseStamped()
        msg.header.stamp = stamp
        msg.header.frame_id = "world"
        msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = x, y, z
        o = msg.pose.orientation
        o.x, o.y, o.z, o.w = qx, qy, qz, qw
        return msg

    # ---------------------------------------------------------------- commands
    def on_command(self, msg: JointState) -> None:
        try:
            targets = self.sim.command(msg.name, msg.position)
            self.commands_applied += 1
            applied = JointState(name=list(targets), position=list(targets.values()))
            applied.header.stamp = self._stamp()
            self.applied_pub.publish(applied)
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
            self.before_reset()
            self.sim.reset(dict(zip(request.joint_names, request.joint_positions)), reset_box=request.reset_box)
        except CommandRejected as error:
            response.error = ErrorCode(code=getattr(ErrorCode, error.code), message=str(error))
            return response
        self._restart_clock()
        self.get_logger().info("workcell reset")
        response.error = ErrorCode(code=ErrorCode.NONE, message="")
        return response

    def before_reset(self) -> None:
        """Hook: a new episode starts (the bridge draws new physics here)."""

    # ---------------------------------------------------------------- status
    def publish_diagnostic(self, level: bytes, message: str) -> None:
        status = DiagnosticStatus(level=level, name=f"{self.get_name()}: joint_command",
                                  message=message, hardware_id=self.get_name())
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(array)

    def publish_status(self) -> None:
        msg = SystemStatus(component=self.get_name(), level=SystemStatus.LEVEL_OK, message="running")
        msg.header.stamp = self.get_clock().now().to_msg()
        if self.cameras is not None and self.cameras.poll() is not None:
            msg.level, msg.message = SystemStatus.LEVEL_ERROR, "camera process exited"
        elif self.camera_status is not None and self.camera_status.level != SystemStatus.LEVEL_OK:
            msg.level, msg.message = self.camera_status.level, self.camera_status.message
        msg.values = [KeyValue(key="joint_states_rate_hz", value=f"{self.joint_state_rate.rate_hz():.1f}"),
                      KeyValue(key="commands_applied", value=str(self.commands_applied)),
                      KeyValue(key="commands_rejected", value=str(self.commands_rejected)),
                      KeyValue(key="lag_skips", value=str(self.lag_skips)),
                      KeyValue(key="sim_time_s", value=f"{self.sim.time_s:.3f}")]
        if self.camera_status is not None:
            msg.values += list(self.camera_status.values)
        self.status_pub.publish(msg)

    # ---------------------------------------------------------------- cameras
    def _start_cameras(self) -> subprocess.Popen:
        parameters = {**self.served.camera_parameters,
                      "scene_state": self.scene_state.name,
                      "seed": str(self.p["seed"] + 1),
                      "camera_rate_hz": str(self.p["camera_rate_hz"]),
                      "use_sim_time": "true" if self.simulated_clock else "false",
                      "parent_pid": str(os.getpid())}
        args = [sys.executable, "-m", "twinloop_sim.emulated_cameras_node", "--ros-args",
                "-r", f"__ns:={self.get_namespace()}", "-r", f"__node:={self._cameras_node_name()}"]
        for name, value in parameters.items():
            args += ["-p", f"{name}:={value}"]
        nice = int(self.p["camera_nice"])
        # On a real cell the cameras are devices of their own; rendered here, they would take
        # the CPU from the robot's control path (physics, the envelope monitor) on a loaded host.
        return subprocess.Popen(args, preexec_fn=(lambda: os.nice(nice)) if nice > 0 else None)

    def _cameras_node_name(self) -> str:
        """Named after this node: an emulated workcell and a sim bridge may run side by side."""
        return f"{self.get_name()}_cameras"

    def destroy_node(self) -> None:
        if self.cameras is not None and self.cameras.poll() is None:
            self.cameras.terminate()
            try:
                self.cameras.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.cameras.kill()
        self.scene_state.close()
        super().destroy_node()
