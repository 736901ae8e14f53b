"""Envelope monitor: the only writer of the hardware command topic.

Forwards a command from the twinloop command sources to /joint_command only while armed
and only when it passes every check of twinloop_safety.envelope; on a violation it holds
the measured position, latches the fault, publishes the reason on a latched status, and
waits for ~/reset_fault. The checks live in envelope.py; this node translates messages.

No `from __future__ import annotations` here: rclpy hands a timer callback its TimerInfo
only when the parameter is annotated with the class itself, not with its name.
"""
import time

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import WrenchStamped
from rclpy.node import Node
from rclpy.timer import TimerInfo
from twinloop_ros.qos import COMMANDS, LATCHED, RELIABLE, SENSOR
from sensor_msgs.msg import JointState
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode
from twinloop_interfaces.srv import ResetFault, SetArmed
from visualization_msgs.msg import MarkerArray

from twinloop_safety.envelope import (EnvelopeConfigError, EnvelopeMonitor, Fault, HoldUpGuard, State, Violation,
                                      limits_from_parameters, limits_summary, tighten_from_twin)
from twinloop_safety.markers import envelope_markers
from twinloop_ros.node import StartupError, declare, make_executor, run_node
from twinloop_twin.bundle import TwinError, load_twin
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.workcell import ExampleRobotDataMissing, WorkcellConfigError, load_workcell

# Marks the monitor's own hold commands on /joint_command (and in recorded bags).
HOLD_FRAME_ID = "envelope_hold"
STATE_LEVEL = {State.DISARMED: DiagnosticStatus.OK, State.ARMED: DiagnosticStatus.OK, State.FAULT: DiagnosticStatus.ERROR}


class EnvelopeMonitorNode(Node):
    def __init__(self) -> None:
        super().__init__("envelope_monitor")
        p = declare(self, {
            "workcell_config": ("", "workcell YAML; empty: config/workcell.yaml"),
            "urdf": ("", "workcell URDF (robot merged in); empty: urdf/workcell.urdf"),
            "joint_names": (["panda_joint1", "panda_joint2", "panda_joint3", "panda_joint4", "panda_joint5",
                             "panda_joint6", "panda_joint7", "panda_finger_joint1"], "commandable joints; every per-joint list follows this order"),
            "position_margins": ([0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.0],
                                  "rad (m for the finger): URDF position limits shrunk by this"),
            "velocity_scale": (0.5, "fraction of the URDF velocity limits allowed"),
            "acceleration_limits": ([7.5, 3.75, 5.0, 6.25, 7.5, 10.0, 10.0, 1.0], "rad/s^2 (m/s^2), per joint"),
            "max_target_lead": ([0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.25, 0.04],
                                 "rad (m): largest |target - measured position|"),
            "command_period_s": (0.004, "s, nominal period of the command stream (rate checks use it)"),
            "limit_mode": ("reject", "'reject' (latch a fault) or 'rate_limit' (clamp) on velocity/acceleration"),
            "workspace_min": ([-0.35, -0.55, 0.755], "m, world frame: workspace box corner"),
            "workspace_max": ([0.85, 0.55, 1.75], "m, world frame: workspace box corner"),
            "keep_out_boxes": ([0.9, 0.2, 0.75, 1.1, 0.4, 1.45], "m, world: xmin ymin zmin xmax ymax zmax per box"),
            "keep_out_names": (["static_camera_stand"], "one name per keep-out box"),
            "cartesian_margin_m": (0.02, "m: workspace shrunk and keep-out boxes grown by this"),
            "checked_links": (["panda_link4", "panda_link6", "panda_link7", "panda_hand", "panda_hand_tcp"],
                              "links whose origins must stay in the workspace and out of keep-out boxes"),
            "sample_spacing_rad": (0.02, "rad: largest joint step between FK samples along a commanded step"),
            "max_force_n": (60.0, "N: external force limit from the wrench topic; <= 0 disables"),
            "command_timeout_s": (0.1, "s: stale command stream once armed and commanded"),
            "joint_state_timeout_s": (0.1, "s: stale joint states"),
            "control_rate_hz": (100.0, "Hz: watchdog rate (10 ms resolution against 0.1-0.5 s timeouts)"),
            "hold_republish_hz": (10.0, "Hz: the hold command is repeated at this rate while faulted"),
            "command_topics": (["/twinloop/policy/command", "/twinloop/calibration/command",
                                "/twinloop/builder/command", "/twinloop/planning/command"],
                               "twinloop command sources (one streams at a time)"),
            "joint_states_topic": ("/joint_states", "measured joint states"),
            "wrench_topic": ("/wrench", "external wrench (optional)"),
            "joint_command_topic": ("/joint_command", "the hardware command topic"),
            "twin_path": ("", "twin version folder whose uncertainty widens the margins; empty: none"),
            "twin_k_sigma": (3.0, "standard deviations of the twin's command delay added to the margins"),
            "max_cartesian_speed_m_s": (1.0, "m/s: link speed bound used to widen the Cartesian margin"),
            "armed_on_start": (False, "arm as soon as a joint state arrives"),
        })
        try:
            workcell = load_workcell(p["workcell_config"] or None, p["urdf"] or None)
            kinematics = UrdfTransforms(workcell.urdf_xml)
            limits = limits_from_parameters(kinematics, p)
            if p["twin_path"]:
                limits = tighten_from_twin(limits, load_twin(p["twin_path"]).parameters, k_sigma=p["twin_k_sigma"],
                                           max_cartesian_speed_m_s=p["max_cartesian_speed_m_s"])
        except (EnvelopeConfigError, TwinError, WorkcellConfigError, ExampleRobotDataMissing) as error:
            raise StartupError(f"envelope configuration: {error}") from error
        self.monitor = EnvelopeMonitor(limits, kinematics)
        self.hold_up_guard = HoldUpGuard(1.0 / p["control_rate_hz"],
                                         min(limits.command_timeout_s, limits.joint_state_timeout_s))
        self._arm_on_start = p["armed_on_start"]

        self.command_pub = self.create_publisher(JointState, p["joint_command_topic"], COMMANDS)
        self.status_pub = self.create_publisher(EnvelopeStatus, "/twinloop/envelope/status", LATCHED)
        self.marker_pub = self.create_publisher(MarkerArray, "/twinloop/envelope/markers", LATCHED)
        self.diagnostics_pub = self.create_publisher(DiagnosticArray, "/diagnostics", RELIABLE)
        for topic in p["command_topics"]:
            self.create_subscription(JointState, topic, self.on_command, COMMANDS)
        # Only the freshest joint state matters: a monitor running behind takes the latest
        # instead of working through a backlog of older ones (every command must be taken).
        self.create_subscription(JointState, p["joint_states_topic"], self.on_joint_state, SENSOR)
        self.create_subscription(WrenchStamped, p["wrench_topic"], self.on_wrench, SENSOR)
        self.create_service(SetArmed, "~/set_armed", self.on_set_armed)
        self.create_service(ResetFault, "~/reset_fault", self.on_reset_fault)
        self.create_timer(1.0 / p["control_rate_hz"], self.on_tick)
        self.create_timer(1.0 / p["hold_republish_hz"], self.on_hold_repeat)
        self.create_timer(1.0, self.publish_diagnostics)
        self.publish_status()
        self.get_logger().info(f"envelope monitor up ({limits.limit_mode}, {len(limits.keep_out)} keep-out boxes, "
                               f"margin {limits.cartesian_margin_m:.3f} m); disarmed until ~/set_armed")

    # ---------------------------------------------------------------- inputs
    def on_joint_state(self, msg: JointState) -> None:
        self.monitor.on_joint_state(msg.name, msg.position, msg.velocity, time.monotonic())
        if self._arm_on_start:
            self._arm_on_start = False
            self.monitor.arm()
            self.publish_status()

    def on_wrench(self, msg: WrenchStamped) -> None:
        f = msg.wrench.force
        self._react(self.monitor.on_force((f.x, f.y, f.z), time.monotonic()))

    def on_command(self, msg: JointState) -> None:
        decision = self.monitor.check_command(msg.name, msg.position, time.monotonic())
        if decision.forward is not None:
            out = JointState(header=msg.header, name=decision.names, position=decision.forward)
            self.command_pub.publish(out)
        elif decision.violation is not None:
            self._react(decision.violation)
        else:
            self.get_logger().warn(f"command not forwarded: {decision.rejected_quietly}", throttle_duration_sec=2.0)

    def on_tick(self, info: TimerInfo) -> None:
        # Judged as of when the tick was due: the executor handles events in arrival order,
        # so every message that arrived before then has been handled; a tick that runs late
        # must not read the messages still queued behind it as silence. The first tick after
        # the monitor itself was held up does not judge (HoldUpGuard).
        now = time.monotonic()
        if not self.hold_up_guard.tick(now):
            return
        late_s = max(0.0, (info.actual_call_time - info.expected_call_time).nanoseconds * 1e-9)
        violation = self.monitor.tick(now - late_s)
        if violation is not None and violation.fault is Fault.STALE_JOINT_STATE:
            # What a stale verdict needs to be told apart: the inputs stopped arriving, or
            # this process did not run (then the tick is late, or hold-ups were counted).
            guard = self.hold_up_guard
            command_age = self.monitor.last_command_age_s(now - late_s)
            self.get_logger().error(
                f"stale joint states judged by a tick {late_s * 1e3:.1f} ms late; monitor held up {guard.hold_ups} "
                f"time(s), {guard.held_up_s * 1e3:.0f} ms in all; last command "
                f"{'none' if command_age is None else f'{command_age * 1e3:.0f} ms'} before the tick")
        self._react(violation)

    def _react(self, violation: Violation | None) -> None:
        if violation is None:
            return  # faults latch only from ARMED, so a returned violation is always new
        self.publish_hold()
        self.get_logger().error(f"envelope fault {violation.fault.name}: {violation.reason}")
        self.publish_status()
        self.publish_diagnostics()

    # ---------------------------------------------------------------- outputs
    def publish_hold(self) -> None:
        hold = self.monitor.hold_positions
        if hold:
            msg = JointState(name=list(hold), position=list(hold.values()))
            msg.header.frame_id = HOLD_FRAME_ID
            msg.header.stamp = self.get_clock().now().to_msg()
            self.command_pub.publish(msg)

    def on_hold_repeat(self) -> None:
        if self.monitor.state is State.FAULT:
            self.publish_hold()

    def publish_status(self) -> None:
        m = self.monitor
        msg = EnvelopeStatus(state=int(m.state), fault=int(m.fault.fault) if m.fault else 0,
                             reason=m.fault.reason if m.fault else "", joint_names=list(m.fault.joints) if m.fault else [],
                             commands_forwarded=m.commands_forwarded, commands_rejected=m.commands_rejected)
        msg.header.stamp = self.get_clock().now().to_msg()
        self.status_pub.publish(msg)
        self.marker_pub.publish(envelope_markers(m.limits, m.state, msg.header.stamp))

    def publish_diagnostics(self) -> None:
        m = self.monitor
        status = DiagnosticStatus(level=STATE_LEVEL[m.state], name=f"{self.get_name()}: envelope",
                                  message=m.state.name.lower() + (f": {m.fault.fault.name}: {m.fault.reason}" if m.fault else ""),
                                  hardware_id="envelope_monitor")
        values = {"commands_forwarded": str(m.commands_forwarded), "commands_rejected": str(m.commands_rejected),
                  "commands_limited": str(m.commands_limited), "held_up_s": f"{self.hold_up_guard.held_up_s:.3f}",
                  "hold_ups": str(self.hold_up_guard.hold_ups), **limits_summary(m.limits)}
        status.values = [KeyValue(key=k, value=v) for k, v in values.items()]
        array = DiagnosticArray(status=[status])
        array.header.stamp = self.get_clock().now().to_msg()
        self.diagnostics_pub.publish(array)

    # ---------------------------------------------------------------- services
    def on_set_armed(self, request: SetArmed.Request, response: SetArmed.Response):
        refusal = ""
        if request.armed:
            refusal = self.monitor.arm()
        else:
            was_armed = self.monitor.state is State.ARMED
            self.monitor.disarm()
            if was_armed:
                self.publish_hold()
        response.error = ErrorCode(code=ErrorCode.NOT_READY if refusal else ErrorCode.NONE, message=refusal)
        response.state = int(self.monitor.state)
        self.publish_status()
        return response

    def on_reset_fault(self, request: ResetFault.Request, response: ResetFault.Response):
        cleared, refusal = self.monitor.reset_fault()
        response.cleared_fault = int(cleared)
        response.error = ErrorCode(code=ErrorCode.NOT_READY if refusal else ErrorCode.NONE, message=refusal)
        if not refusal and cleared:
            self.get_logger().info(f"fault {cleared.name} reset by the operator: {request.operator_note!r}")
        self.publish_status()
        return response

    def destroy_node(self) -> None:
        # Stop safely: whatever was forwarded last is replaced by the measured position.
        if self.monitor.state is State.ARMED:
            self.monitor.disarm()
            try:
                self.publish_hold()
            except Exception:  # noqa: BLE001 - the context may already be gone on a hard shutdown
                pass
        super().destroy_node()


def main(args=None) -> None:
    run_node(EnvelopeMonitorNode, args, executor=make_executor())


if __name__ == "__main__":
    main()
