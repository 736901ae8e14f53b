"""Fault injection through the envelope monitor, asserted on the emulated workcell's joints.

An emulated workcell and an envelope monitor run as subprocesses on a private domain; the
test publishes like a policy (a smooth ramp on /twinloop/policy/command), injects one fault
per case mid-ramp, and checks on /joint_states and /joint_command that the robot holds the
position measured at the fault, that the fault is latched with the right reason, and that
a reset restores forwarding.
"""
from __future__ import annotations

import math
import os
import signal
import threading
import time

import numpy as np
import pytest
from geometry_msgs.msg import WrenchStamped
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode
from visualization_msgs.msg import MarkerArray

from twinloop_ros.testing import COMMANDED, LATCHED, EnvelopeCell, stamp_s
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.workcell import load_workcell

pytestmark = pytest.mark.ros

CONTROL_RATE_HZ = 100.0  # config/envelope.yaml's
# Generous watchdogs: other test processes share the 2 cores and may stall a sender.
TIMEOUT_S = 0.5
KEEP_OUT = [0.05, 0.10, 1.0, 0.45, 0.30, 1.6]  # hand enters it when joint 1 turns by > ~0.26 rad
WORKSPACE_MIN = [-0.35, -0.12, 0.77]  # hand leaves it when joint 1 turns by < ~-0.33 rad
MARGIN_M = 0.02
# Hold reaction: the goal is 4 ms (two periods of the 500 Hz joint states); the bound leaves room for a loaded
# 2-core host (bench/envelope_latency.py measures the distribution).
REACTION_BOUND_S = 0.06
# A watchdog fault is seen by the monitor's 100 Hz tick (10 ms resolution), which a loaded
# host runs late: 62 ms after the timeout was seen at load 7 on 2 cores.
WATCHDOG_REACTION_BOUND_S = 0.1
MONITOR = {"command_timeout_s": TIMEOUT_S, "joint_state_timeout_s": TIMEOUT_S,
           "control_rate_hz": CONTROL_RATE_HZ, "keep_out_boxes": KEEP_OUT, "keep_out_names": ["test_zone"],
           "workspace_min": WORKSPACE_MIN, "cartesian_margin_m": MARGIN_M, "max_force_n": 60.0}


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    cell = EnvelopeCell(tmp_path_factory.mktemp("envelope"), MONITOR)
    yield cell
    cell.close()


@pytest.fixture(scope="module")
def kinematics():
    return UrdfTransforms(load_workcell().urdf_xml)


def _assert_holds(cell: EnvelopeCell, violation_s: float, fault: int, reason_part: str,
                  joint: str = "panda_joint1", armed: EnvelopeStatus | None = None,
                  forwarded: int | None = None) -> dict[str, float]:
    """`violation_s`: system time of the violation. `forwarded`: how many commands since
    `armed` (the status after arming) the monitor must have forwarded, counted by the
    monitor itself: every command before the violating one, and not that one."""
    status = cell.wait_for_fault()
    assert status.fault == fault, f"latched {status.fault} ({status.reason}), expected {fault}"
    assert reason_part in status.reason, status.reason
    if forwarded is not None:
        assert status.commands_forwarded - armed.commands_forwarded == forwarded, \
            "the monitor forwarded the violating command, or refused one before it"
    cell.probe.wait_for(lambda: cell.holds_after(violation_s - 0.01), 2.0, "a hold command")
    hold = cell.holds_after(violation_s - 0.01)[0]
    reaction_s = stamp_s(hold.header.stamp) - violation_s
    print(f"{status.reason[:70]!r}: hold {reaction_s * 1e3:.1f} ms after the violation")
    assert reaction_s <= REACTION_BOUND_S
    assert list(hold.name) == COMMANDED
    held = dict(zip(hold.name, hold.position))
    # The hold is the position measured at the fault (joint states are 2 ms apart).
    near = [s for _, (t, s) in cell.joint_states if abs(t - stamp_s(hold.header.stamp)) < 0.05]
    assert near and min(abs(s[joint] - held[joint]) for s in near) < 2e-3
    time.sleep(1.2)  # the ramp keeps sending: forwarded, it would move the joint by ~0.3 rad more
    final = cell.measured()
    for joint in COMMANDED[:7]:
        assert abs(final[joint] - held[joint]) < 3e-3, (joint, final[joint], held[joint])
    assert not cell.forwarded_after_first_hold(violation_s - 0.01), "a command was forwarded after the fault"
    return held


def _first_refused(cell: EnvelopeCell, ramp, armed: EnvelopeStatus) -> tuple[float, int]:
    """(send time, index) of the ramp's first command the monitor refused, from the
    monitor's own count of forwarded commands since arming."""
    status = cell.wait_for_fault()
    index = status.commands_forwarded - armed.commands_forwarded
    assert index < len(ramp.sent_real), "the monitor faulted without refusing a ramp command"
    return ramp.sent_real[index], index


def _assert_reset_restores_forwarding(cell: EnvelopeCell, velocity: float = -0.3) -> None:
    response = cell.reset_fault()
    assert response.error.code == ErrorCode.NONE, response.error.message
    measured = cell.measured()
    start = {j: measured[j] for j in COMMANDED[:7]} | {"panda_finger_joint1": cell.home["panda_finger_joint1"]}
    ramp = cell.ramp(start, "panda_joint1", velocity, duration_s=0.6)
    ramp.join()
    # Disarm before the stream's silence trips the command watchdog, as a runner does.
    cell.set_armed(False)
    assert cell.latest_status().state == EnvelopeStatus.STATE_DISARMED, cell.latest_status().reason
    time.sleep(0.3)
    moved = cell.measured()["panda_joint1"] - start["panda_joint1"]
    assert moved * math.copysign(1.0, velocity) > 0.05, "forwarding did not resume"


def _bad(joint: str, value: float):
    def inject(step, targets):
        return {**targets, joint: value}
    return inject


COMMAND_FAULTS = {
    "nan": (_bad("panda_joint1", math.nan), EnvelopeStatus.FAULT_NON_FINITE_COMMAND, "non-finite"),
    "inf": (_bad("panda_joint3", math.inf), EnvelopeStatus.FAULT_NON_FINITE_COMMAND, "panda_joint3"),
    "unknown_joint": (lambda step, t: {**t, "joint_a1": 0.1}, EnvelopeStatus.FAULT_UNKNOWN_JOINT, "joint_a1"),
    "beyond_limit": (_bad("panda_joint4", 0.0), EnvelopeStatus.FAULT_POSITION_LIMIT, "panda_joint4"),
    "velocity_spike": (lambda step, t: {**t, "panda_joint2": t["panda_joint2"] + 0.03},
                       EnvelopeStatus.FAULT_VELOCITY_LIMIT, "panda_joint2"),
}


@pytest.mark.parametrize("case", list(COMMAND_FAULTS))
def test_bad_command_is_held_latched_and_reset(cell, case):
    inject, fault, reason = COMMAND_FAULTS[case]
    start = cell.prepare()
    armed = cell.latest_status()
    ramp = cell.ramp(start, "panda_joint1", 0.3, duration_s=2.0, inject=inject, inject_at_s=0.4)
    cell.probe.wait_for(lambda: ramp.injected_at is not None, 3.0, "the injection")
    held = _assert_holds(cell, ramp.injected_at, fault, reason, armed=armed, forwarded=ramp.sent_before_injection)
    assert held["panda_joint1"] - start["panda_joint1"] > 0.02, "the ramp had not moved the arm"
    ramp.join()
    _assert_reset_restores_forwarding(cell)


def _hand_positions(cell, kinematics, link="panda_hand") -> np.ndarray:
    return np.array([kinematics.world_T_link(link, s)[:3, 3] for _, (_, s) in cell.joint_states[::10]])


def test_keep_out_box_is_never_entered(cell, kinematics):
    start = cell.prepare()
    armed = cell.latest_status()
    ramp = cell.ramp(start, "panda_joint1", 0.4, duration_s=2.0)
    status = cell.wait_for_fault(5.0)
    refused_at, index = _first_refused(cell, ramp, armed)
    _assert_holds(cell, refused_at, EnvelopeStatus.FAULT_KEEP_OUT, "test_zone", armed=armed, forwarded=index)
    ramp.join()
    # The real box (without the margin) was never entered by the hand: FK of what the robot reported.
    y = _hand_positions(cell, kinematics)[:, 1]
    assert y.max() < KEEP_OUT[1], f"hand reached y = {y.max():.3f} m"
    assert y.max() > KEEP_OUT[1] - MARGIN_M - 0.03, "the arm did not approach the box"
    assert "would enter keep-out box" in status.reason
    _assert_reset_restores_forwarding(cell, velocity=-0.3)


def test_workspace_box_is_never_left(cell, kinematics):
    start = cell.prepare()
    armed = cell.latest_status()
    ramp = cell.ramp(start, "panda_joint1", -0.4, duration_s=2.0)
    cell.wait_for_fault(5.0)
    refused_at, index = _first_refused(cell, ramp, armed)
    _assert_holds(cell, refused_at, EnvelopeStatus.FAULT_WORKSPACE, "workspace", armed=armed, forwarded=index)
    ramp.join()
    y = _hand_positions(cell, kinematics)[:, 1]
    assert y.min() > WORKSPACE_MIN[1], f"hand reached y = {y.min():.3f} m"
    assert y.min() < WORKSPACE_MIN[1] + MARGIN_M + 0.03, "the arm did not approach the boundary"
    _assert_reset_restores_forwarding(cell, velocity=0.3)


def test_stale_command_stream(cell):
    start = cell.prepare()
    ramp = cell.ramp(start, "panda_joint1", 0.3, duration_s=0.6)  # then the sender goes silent
    ramp.join()
    held = _assert_holds(cell, ramp.sent_real[-1] + TIMEOUT_S, EnvelopeStatus.FAULT_STALE_COMMAND, "no command")
    assert held["panda_joint1"] > start["panda_joint1"] + 0.05
    _assert_reset_restores_forwarding(cell)


def test_external_force_over_the_limit(cell):
    start = cell.prepare()
    sent = {}

    def push(step, targets):
        msg = WrenchStamped()
        msg.wrench.force.x, msg.wrench.force.z = 50.0, 50.0  # 70.7 N > 60 N
        msg.header.stamp = cell.probe.node.get_clock().now().to_msg()
        sent["t"] = stamp_s(msg.header.stamp)
        cell.wrench_pub.publish(msg)
        return None

    ramp = cell.ramp(start, "panda_joint1", 0.3, duration_s=2.0, inject=push, inject_at_s=0.4)
    cell.probe.wait_for(lambda: "t" in sent, 3.0, "the wrench")
    _assert_holds(cell, sent["t"], EnvelopeStatus.FAULT_FORCE_LIMIT, "70.7 N")
    ramp.join()
    calm = WrenchStamped()
    calm.wrench.force.z = 5.0
    cell.wrench_pub.publish(calm)
    time.sleep(0.1)
    _assert_reset_restores_forwarding(cell)


def test_stale_joint_states(cell):
    start = cell.prepare()
    # Joint 7 turns the hand about its own axis: no Cartesian limit is near. Slowly: once the
    # joint states stop, the target's lead over the last measured position grows at the ramp's
    # speed and would fault on its own (max_target_lead, 0.25 rad) if the watchdog ran late.
    # At 0.1 rad/s the lead is ~0.06 rad when the 0.5 s watchdog is due, 1.9 s from that
    # limit; at 0.3 rad/s it was ~0.17, and a fresh-clone run faulted on the lead first.
    ramp = cell.ramp(start, "panda_joint7", 0.1, duration_s=5.5)
    time.sleep(1.2)
    frozen_at = time.time()
    os.kill(cell.workcell.process.pid, signal.SIGSTOP)  # the robot driver stops reporting
    try:
        status = cell.wait_for_fault(3.0)
    finally:
        os.kill(cell.workcell.process.pid, signal.SIGCONT)
    assert status.fault == EnvelopeStatus.FAULT_STALE_JOINT_STATE, status.reason
    hold = cell.holds_after(frozen_at - 0.05)[0]
    reaction_s = stamp_s(hold.header.stamp) - (frozen_at + TIMEOUT_S)
    print(f"stale joint states: hold {reaction_s * 1e3:.1f} ms after the timeout")
    assert reaction_s <= WATCHDOG_REACTION_BOUND_S
    ramp.join()
    time.sleep(1.0)
    held = dict(zip(hold.name, hold.position))
    final = cell.measured()
    # Commands forwarded before the timeout reach the robot once it runs again; the hold
    # comes after them and wins.
    assert abs(final["panda_joint7"] - held["panda_joint7"]) < 3e-3
    assert held["panda_joint7"] > start["panda_joint7"] + 0.05
    assert ramp.sent[-1][1]["panda_joint7"] > held["panda_joint7"] + 0.3
    _assert_reset_restores_forwarding(cell)


def test_disarmed_monitor_forwards_nothing(cell):
    start = cell.prepare()
    cell.set_armed(False)
    before = len(cell.hardware_commands)
    ramp = cell.ramp(start, "panda_joint1", 0.3, duration_s=0.5)
    ramp.join()
    time.sleep(0.3)
    forwarded = [m for _, m in cell.hardware_commands[before:] if m.header.frame_id != "envelope_hold"]
    assert not forwarded
    assert abs(cell.measured()["panda_joint1"] - start["panda_joint1"]) < 2e-3


def test_well_behaved_commands_pass_unchanged(cell):
    start = cell.prepare()
    armed = cell.latest_status()
    ramp = cell.ramp(start, "panda_joint2", 0.25, acceleration=3.0, duration_s=1.5)
    ramp.join()
    final = ramp.sent[-1][1]["panda_joint2"]
    # The robot reaches the last target: every command went through (the servo settles
    # within ~1.5 s; joint 2 carries the arm's weight).
    cell.probe.wait_for(lambda: abs(cell.measured()["panda_joint2"] - final) < 3e-3, 5.0, "the final target")
    cell.set_armed(False)
    status = cell.latest_status()
    assert status.state == EnvelopeStatus.STATE_DISARMED and status.fault == 0, status.reason
    # The monitor's own counts: all forwarded, none refused.
    assert status.commands_forwarded - armed.commands_forwarded == len(ramp.sent)
    assert status.commands_rejected == armed.commands_rejected
    # Matched by stamp: a stamp comes back as sec/nanosec, so a float key rounded to the
    # microsecond can fall on either side of a rounding boundary; stamps are 4 ms apart,
    # so the nearest sent stamp within 10 us is the one.
    sent_t = np.array([t for t, _ in ramp.sent])
    out = {}
    for _, m in cell.hardware_commands:
        if m.header.frame_id != "":
            continue
        i = int(np.argmin(np.abs(sent_t - stamp_s(m.header.stamp))))
        if abs(sent_t[i] - stamp_s(m.header.stamp)) < 1e-5:
            out[i] = dict(zip(m.name, m.position))
    sent = {i: c for i, (_, c) in enumerate(ramp.sent)}
    # The probe itself may miss a few of them on a loaded host; what it saw is unchanged.
    assert len(out) > 0.9 * len(sent), f"{len(sent) - len(out)} of {len(sent)} commands seen coming out"
    assert all(out[t] == sent[t] for t in out), "a command was changed on its way"


def test_markers_and_status_are_latched(cell):
    markers = cell.probe.collect(MarkerArray, "/twinloop/envelope/markers", LATCHED)
    cell.probe.wait_for(lambda: markers, 5.0, "markers")
    boxes = {(m.ns, m.id): m for m in markers[-1][1].markers}
    zone = boxes[("keep_out", 0)]
    assert zone.text == "test_zone"
    assert (zone.scale.x, zone.scale.y, zone.scale.z) == pytest.approx((0.4, 0.2, 0.6))
    assert boxes[("workspace", 0)].pose.position.y == pytest.approx((WORKSPACE_MIN[1] + 0.55) / 2)


# ---------------------------------------------------------------- gaps in a command stream
# A stream is a sequence of steps, each referenced to the stream's previous target whatever
# the arrival gap (twinloop_safety.envelope, "Command streams").

PAUSE_S = 0.3  # shorter than the watchdog (TIMEOUT_S), with room for a sender slowed by load


class PausingStream(threading.Thread):
    """Joint 7 (it turns the hand about its own axis: no Cartesian limit is near) ramps to
    `velocity` and cruises at 4 ms steps; after `pause_at_s` the sender pauses for PAUSE_S
    and goes on with the next step, its schedule shifted (no burst of late targets).
    `skip_ahead`: it goes on instead from where its clock says the motion should be by then.
    """

    def __init__(self, cell, start, velocity=0.3, pause_at_s=0.5, duration_s=1.2, skip_ahead=False):
        super().__init__(daemon=True)
        self.cell, self.targets = cell, {j: start[j] for j in COMMANDED}
        self.velocity, self.pause_at_s, self.duration_s, self.skip_ahead = velocity, pause_at_s, duration_s, skip_ahead
        self.sent: list[dict[str, float]] = []
        self.sent_real: list[float] = []  # system time of each publish
        self.resumed_index: int | None = None  # index in `sent` of the first command after the pause
        self.start()

    def run(self) -> None:
        period, speed, step = 0.004, 0.0, 0
        begin = time.monotonic()
        while step * period < self.duration_s:
            step += 1
            speed = min(self.velocity, speed + 3.0 * period)
            self.targets["panda_joint7"] += speed * period
            if self.resumed_index is None and step * period >= self.pause_at_s:
                time.sleep(PAUSE_S)
                begin += PAUSE_S
                if self.skip_ahead:
                    self.targets["panda_joint7"] += self.velocity * PAUSE_S
                self.resumed_index = len(self.sent)
            self.sent_real.append(time.time())
            self.cell.command(dict(self.targets))
            self.sent.append(dict(self.targets))
            time.sleep(max(0.0, begin + step * period - time.monotonic()))


def test_a_pause_shorter_than_the_watchdog_resumes_without_fault(cell):
    start = cell.prepare()
    armed = cell.latest_status()
    stream = PausingStream(cell, start)
    stream.join()
    cell.set_armed(False)  # as a runner does at the end of its stream
    status = cell.latest_status()
    assert status.state == EnvelopeStatus.STATE_DISARMED and status.fault == 0, status.reason
    assert status.commands_forwarded - armed.commands_forwarded == len(stream.sent)
    assert status.commands_rejected == armed.commands_rejected
    gap = stream.sent_real[stream.resumed_index] - stream.sent_real[stream.resumed_index - 1]
    assert PAUSE_S <= gap < TIMEOUT_S, gap  # the pause happened, shorter than the watchdog
    # The robot followed (the hold on disarming stops it a tracking lag short of the end).
    travel = stream.sent[-1]["panda_joint7"] - start["panda_joint7"]
    assert cell.measured()["panda_joint7"] - start["panda_joint7"] > travel - 0.05, travel


def test_a_jump_after_a_pause_faults(cell):
    start = cell.prepare()
    armed = cell.latest_status()
    # 0.3 rad/s for 0.3 s: the first step after the pause is 91 mrad in 4 ms.
    stream = PausingStream(cell, start, duration_s=1.5, skip_ahead=True)
    cell.probe.wait_for(lambda: stream.resumed_index is not None and len(stream.sent_real) > stream.resumed_index,
                        3.0, "the jump")
    _assert_holds(cell, stream.sent_real[stream.resumed_index], EnvelopeStatus.FAULT_VELOCITY_LIMIT,
                  "panda_joint7 +22.", joint="panda_joint7", armed=armed, forwarded=stream.resumed_index)
    stream.join()
    _assert_reset_restores_forwarding(cell)


def test_a_monitor_that_stalls_longer_than_its_watchdogs_resumes_the_stream(tmp_path):
    # The monitor's own process is stopped for 0.7 s mid-stream (as a loaded host can hold
    # it up) with 0.3 s watchdogs, while the sender and the robot run on. On resumption the
    # monitor handles the 175 queued commands late; the stream goes on without a fault.
    # (It faulted here: a command handled after the hold-up, before the joint states queued
    # with it, read the joint states as stale; and 100-deep command topics lost steps.)
    # The scenario needs the sender to keep sending while the monitor is stopped, and the
    # queued commands to reach the monitor when it resumes; when the host held the sender up
    # too (the sender is a thread of this test), or the monitor's watchdog judged before any
    # queued command was delivered, the scenario did not happen and it is played again, up
    # to three times.
    for attempt in range(3):
        sent_during_stop = _stall_the_monitor_mid_stream(tmp_path / f"attempt{attempt}")
        if sent_during_stop > 140:
            return
        if sent_during_stop >= 0:
            print(f"attempt {attempt}: the sender sent {sent_during_stop} of 175 commands while the monitor was "
                  "stopped (the host held it up too); playing the scenario again")
    pytest.fail("in 3 attempts the sender never kept sending while the monitor was stopped, or the monitor never "
                "got the queued commands: the scenario did not happen")


WATCHDOG_S, STOP_S = 0.3, 0.7
CATCH_UP_S = 1.5  # the ramp runs 4 s: 0.6 before the stop, 0.7 stopped, 0.6 after, then this at most


def _forwarded(cell, since: int) -> int:
    """Commands the monitor forwarded (not its holds) among /joint_command messages after the first `since`."""
    return sum(m.header.frame_id != "envelope_hold" for _, m in list(cell.hardware_commands)[since:])


def _sent_by(ramp, t_s: float) -> int:
    """The ramp's commands published before `t_s` (system time)."""
    return sum(t < t_s for t in ramp.sent_real)


def _stall_the_monitor_mid_stream(work) -> int:
    """Stop the monitor 0.7 s mid-stream; assert the stream went on without a fault and
    return how many commands the sender sent while the monitor was stopped (-1: none of
    them reached the monitor before its watchdog judged)."""
    work.mkdir(parents=True)
    stalled = EnvelopeCell(work, {"command_timeout_s": WATCHDOG_S, "joint_state_timeout_s": WATCHDOG_S})
    try:
        start = stalled.prepare()
        armed = stalled.latest_status()
        before = len(stalled.hardware_commands)
        ramp = stalled.ramp(start, "panda_joint7", 0.3, acceleration=2.0, duration_s=4.0)
        time.sleep(0.6)
        monitor_pid = _python_child(stalled.monitor.process.pid)
        os.kill(monitor_pid, signal.SIGSTOP)
        stopped_at = time.time()
        try:
            time.sleep(STOP_S)
        finally:
            os.kill(monitor_pid, signal.SIGCONT)
        time.sleep(0.6)
        # The monitor works through its backlog: wait until the probe has seen it forward what
        # was sent 0.1 s ago (at most CATCH_UP_S), then disarm. A disarm request handled while
        # commands are still queued refuses them (seen once in a fresh-clone run: 322 of 452
        # forwarded, no fault, 0.6 s after the resumption).
        deadline = time.monotonic() + CATCH_UP_S
        while time.monotonic() < deadline and _forwarded(stalled, before) < _sent_by(ramp, time.time() - 0.1):
            time.sleep(0.02)
        disarm_at = time.time()
        stalled.set_armed(False)  # mid-stream: the rest is refused quietly, nothing waits on a watchdog
        ramp.stop_sending.set()
        ramp.join()
        status = stalled.latest_status()
        sent_before_stop = _sent_by(ramp, stopped_at)
        if (status.fault == EnvelopeStatus.FAULT_STALE_COMMAND
                and status.commands_forwarded - armed.commands_forwarded <= sent_before_stop):
            # Not one of the commands sent during the stop reached the monitor before its
            # watchdog judged, a watchdog period and more after it resumed (seen in 2 of 4 full-suite
            # runs on a loaded host; never alone): the transport had not delivered them, so
            # the scenario (a monitor resuming with its queue) did not happen.
            print(f"the monitor got none of the queued commands before its watchdog: {status.reason}")
            return -1
        sender_gap = max((b - a for a, b in zip(ramp.sent_real, ramp.sent_real[1:])), default=0.0)
        if status.fault == EnvelopeStatus.FAULT_STALE_COMMAND and sender_gap > 0.6 * WATCHDOG_S:
            # The sender (a thread of this test) was itself held up near the watchdog's limit
            # (seen once in a full-suite run: 'no command for 207 ms' after the resumption):
            # a real gap in the stream, which the watchdog is there to catch.
            print(f"the sender was held {sender_gap * 1e3:.0f} ms ({status.reason}); playing the scenario again")
            return -1
        assert status.state == EnvelopeStatus.STATE_DISARMED and status.fault == 0, status.reason
        # Everything sent 0.1 s or more before the disarm request (the stall's whole backlog
        # among it) was forwarded. A command published just before the request may reach
        # the monitor after it: a topic and a service are not ordered with each other (seen
        # once in a fresh-clone run: 472 of 473 forwarded, no fault).
        sent_by = _sent_by(ramp, disarm_at - 0.1)
        assert status.commands_forwarded - armed.commands_forwarded >= sent_by, (status, sent_by)
        return sum(stopped_at < t < stopped_at + STOP_S for t in ramp.sent_real)
    finally:
        stalled.close()


def _python_child(pid: int) -> int:
    """The process that runs the node: the wheels re-exec Python once (a child process)."""
    children = open(f"/proc/{pid}/task/{pid}/children").read().split()
    return _python_child(int(children[0])) if children else pid
