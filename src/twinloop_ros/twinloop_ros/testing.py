"""Test support: what the suite's tests and benchmarks share. Production code never imports it.

`EnvelopeCell`: an emulated workcell behind an envelope monitor, both as subprocesses on a
private localhost-only domain, with a probe that publishes like a policy and watches what
reaches the robot.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

from geometry_msgs.msg import WrenchStamped
from rclpy.action import ActionClient
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from twinloop_interfaces.action import RunTrials
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode
from twinloop_interfaces.srv import ResetFault, ResetWorkcell, SetArmed

from twinloop_ros.process import NodeProcess, fresh_domain_id, localhost_env  # noqa: F401 (re-exported)
from twinloop_ros.qos import LATCHED
from twinloop_ros.session import RosProbe, RosSession  # noqa: F401 (re-exported)
from twinloop_twin.workcell import load_workcell

# Deep: the probe is one Python thread taking 500 Hz joint states plus the command topics.
RELIABLE = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
COMMANDED = [f"panda_joint{i}" for i in range(1, 8)] + ["panda_finger_joint1"]
STARTUP_S = 40.0


def stamp_s(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


class EnvelopeCell:
    """Emulated workcell (no cameras) + envelope monitor + probe on one private domain."""

    def __init__(self, log_dir: Path, monitor_parameters: dict[str, Any] | None = None,
                 workcell_parameters: dict[str, Any] | None = None) -> None:
        self.domain_id = fresh_domain_id()
        self.workcell = NodeProcess("twinloop_sim.emulated_workcell_node", self.domain_id,
                                    {"cameras_enabled": False, "seed": 7, **(workcell_parameters or {})},
                                    log_path=log_dir / f"workcell-{self.domain_id}.log")
        self.monitor = NodeProcess("twinloop_safety.envelope_monitor_node", self.domain_id,
                                   monitor_parameters or {}, log_path=log_dir / f"monitor-{self.domain_id}.log")
        self.extra: list[NodeProcess] = []
        self.ramps: list[Ramp] = []
        self.home = load_workcell().home_joint_positions
        self.probe = RosProbe(self.domain_id)
        node = self.probe.node
        self.joint_states = self.probe.collect(
            JointState, "/joint_states", RELIABLE,
            transform=lambda m: (stamp_s(m.header.stamp), dict(zip(m.name, m.position))))
        self.hardware_commands = self.probe.collect(JointState, "/joint_command", RELIABLE)
        self.status = self.probe.collect(EnvelopeStatus, "/twinloop/envelope/status", LATCHED)
        self.policy_pub = node.create_publisher(JointState, "/twinloop/policy/command", RELIABLE)
        self.wrench_pub = node.create_publisher(WrenchStamped, "/wrench", 10)
        self.arm_client = node.create_client(SetArmed, "/envelope_monitor/set_armed")
        self.fault_client = node.create_client(ResetFault, "/envelope_monitor/reset_fault")
        self.reset_client = node.create_client(ResetWorkcell, "/emulated_workcell/reset")
        try:
            self.probe.wait_for(lambda: len(self.joint_states) > 50 and self.status, STARTUP_S,
                                "joint states and envelope status")
            for client in (self.arm_client, self.fault_client, self.reset_client):
                if not client.wait_for_service(timeout_sec=10.0):
                    raise TimeoutError(f"service {client.srv_name} did not appear")
        except TimeoutError as error:
            logs = self.workcell.log() + self.monitor.log()
            self.close()
            raise AssertionError(f"cell did not start ({error}):\n{logs}") from error

    # ------------------------------------------------------------ services
    def call(self, client, request, timeout_s: float = 5.0):
        future = client.call_async(request)
        self.probe.wait_for(future.done, timeout_s, f"response of {client.srv_name}")
        return future.result()

    def set_armed(self, armed: bool) -> SetArmed.Response:
        return self.call(self.arm_client, SetArmed.Request(armed=armed))

    def reset_fault(self) -> ResetFault.Response:
        return self.call(self.fault_client, ResetFault.Request(operator_note="test"))

    def reset_workcell(self, positions: dict[str, float] | None = None) -> None:
        positions = positions or {}
        response = self.call(self.reset_client, ResetWorkcell.Request(
            joint_names=list(positions), joint_positions=list(positions.values()), reset_box=True))
        assert response.error.code == ErrorCode.NONE, response.error.message

    def prepare(self) -> dict[str, float]:
        """Stop earlier command streams, clear any fault, disarm, put the robot home, arm.

        Returns the home targets: targets, not the measured pose (the finger's home is its
        upper limit, and encoder noise would put a measured value a hair beyond it). A
        stream left running by a failed case would otherwise be forwarded after the reset.
        """
        self.stop_ramps()
        self.reset_fault()
        self.set_armed(False)
        self.reset_workcell()
        time.sleep(0.4)
        deadline = time.monotonic() + 5.0
        response = self.set_armed(True)
        while response.error.code != ErrorCode.NONE and time.monotonic() < deadline:
            time.sleep(0.2)  # a loaded host may hold joint states back for a moment
            response = self.set_armed(True)
        assert response.error.code == ErrorCode.NONE, response.error.message
        self.probe.wait_for(lambda: self.latest_status().state == EnvelopeStatus.STATE_ARMED, 5.0, "armed status")
        return dict(self.home)

    # ------------------------------------------------------------ observations
    def run_trials(self, policy_path: str, *, num_trials: int = 1, record: bool = True, timeout_s: float = 90.0,
                   feedback: Callable | None = None, runner_log: Callable[[], str] = lambda: "") -> RunTrials.Result:
        """A RunTrials goal (split held_out) to /policy_runner, waited for; its result."""
        client = ActionClient(self.probe.node, RunTrials, "/policy_runner/run_trials")
        assert client.wait_for_server(timeout_sec=60.0), runner_log()
        sent = client.send_goal_async(RunTrials.Goal(policy_path=policy_path, num_trials=num_trials,
                                                     split="held_out", record=record), feedback_callback=feedback)
        self.probe.wait_for(sent.done, 10.0, "goal acceptance")
        result = sent.result().get_result_async()
        self.probe.wait_for(result.done, timeout_s, "the trials")
        return result.result().result

    def latest_status(self) -> EnvelopeStatus:
        return self.status[-1][1]

    def measured(self) -> dict[str, float]:
        return dict(self.joint_states[-1][1][1])

    def wait_for_fault(self, timeout_s: float = 5.0) -> EnvelopeStatus:
        self.probe.wait_for(lambda: self.latest_status().state == EnvelopeStatus.STATE_FAULT, timeout_s, "a fault")
        return self.latest_status()

    def holds_after(self, t_s: float) -> list[JointState]:
        return [m for _, m in self.hardware_commands
                if m.header.frame_id == "envelope_hold" and stamp_s(m.header.stamp) >= t_s]

    def forwarded_after_first_hold(self, t_s: float) -> list[JointState]:
        """Commands the monitor forwarded after its first hold stamped at or after `t_s`.

        One writer, reliable: the probe receives /joint_command in publish order, so this
        is exact without comparing clocks of different processes.
        """
        messages = [m for _, m in self.hardware_commands]
        first = next((i for i, m in enumerate(messages)
                      if m.header.frame_id == "envelope_hold" and stamp_s(m.header.stamp) >= t_s), None)
        assert first is not None, "no hold after the violation"
        return [m for m in messages[first:] if m.header.frame_id != "envelope_hold"]

    # ------------------------------------------------------------ commands
    def command(self, positions: dict[str, float], frame_id: str = "", stamp_s: float | None = None) -> float:
        """Publish on the policy topic, stamped now (or at `stamp_s`, system clock). Returns the stamp."""
        msg = JointState(name=list(positions), position=[float(v) for v in positions.values()])
        stamp_ns = round(stamp_s * 1e9) if stamp_s is not None else self.probe.node.get_clock().now().nanoseconds
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
        msg.header.frame_id = frame_id
        self.policy_pub.publish(msg)
        return stamp_ns * 1e-9

    def ramp(self, start: dict[str, float], joint: str, velocity: float, acceleration: float = 4.0,
             period_s: float = 0.004, duration_s: float = 1.0,
             inject: Callable[[int, dict[str, float]], dict | None] | None = None,
             inject_at_s: float = 0.5) -> "Ramp":
        ramp = Ramp(self, start, joint, velocity, acceleration, period_s, duration_s, inject, inject_at_s)
        self.ramps.append(ramp)
        return ramp

    def stop_ramps(self) -> None:
        for ramp in self.ramps:
            ramp.stop_sending.set()
            ramp.join()
        self.ramps.clear()

    def stop_extra(self) -> None:
        """Stop the processes a test added (`extra`): after each test, also one that failed,
        so that none answers the next test in place of its own (a second recorder, runner)."""
        while self.extra:
            self.extra.pop().stop()

    def close(self) -> None:
        self.stop_ramps()
        self.probe.close()
        self.stop_extra()
        self.monitor.stop()
        self.workcell.stop()


class Ramp(threading.Thread):
    """A well-behaved command stream: `joint` accelerates to `velocity` and cruises.

    The increment per message is fixed and each message is stamped with its tick of the
    schedule (as a policy on a timer computes and stamps it), so sender jitter changes only
    when a step arrives, never its size or stamp. `inject(step, targets)` may
    return a command to send instead at `inject_at_s`; its send time is `injected_at`, and
    `sent_before_injection` counts the ramp's commands published before it.
    """

    def __init__(self, cell, start, joint, velocity, acceleration, period_s, duration_s, inject, inject_at_s):
        super().__init__(daemon=True)
        self.cell, self.targets = cell, {j: start[j] for j in COMMANDED}
        self.joint, self.velocity, self.acceleration = joint, velocity, acceleration
        self.period_s, self.duration_s, self.inject, self.inject_at_s = period_s, duration_s, inject, inject_at_s
        self.injected_at: float | None = None
        self.sent_before_injection: int | None = None
        self.last_sent_at: float | None = None
        self.stop_sending = threading.Event()
        self.sent: list[tuple[float, dict[str, float]]] = []  # (stamp, targets)
        self.sent_real: list[float] = []  # system time each of `sent` was published
        self.start()

    def run(self) -> None:
        speed = 0.0
        begin = time.monotonic()
        begin_stamp = time.time()
        step = 0
        while time.monotonic() - begin < self.duration_s and not self.stop_sending.is_set():
            step += 1
            sign = 1.0 if self.velocity >= 0 else -1.0
            speed = min(abs(self.velocity), speed + self.acceleration * self.period_s)
            self.targets[self.joint] += sign * speed * self.period_s
            command = dict(self.targets)
            if self.inject is not None and self.injected_at is None and time.monotonic() - begin >= self.inject_at_s:
                replacement = self.inject(step, command)
                self.sent_before_injection = len(self.sent)
                sent_at = time.time()  # the violation happens now (the stamp is the schedule's)
                if replacement is not None:
                    self.last_sent_at = self.cell.command(replacement, frame_id="injected",
                                                          stamp_s=begin_stamp + step * self.period_s)
                self.injected_at = sent_at
                if replacement is not None:
                    time.sleep(self.period_s)
                    continue
            self.sent_real.append(time.time())
            self.last_sent_at = self.cell.command(command, stamp_s=begin_stamp + step * self.period_s)
            self.sent.append((self.last_sent_at, command))
            time.sleep(max(0.0, begin + step * self.period_s - time.monotonic()))
