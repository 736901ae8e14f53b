"""`twinloop build excite` over DDS: the excitation reaches the emulated workcell only
through the envelope monitor, armed per played trajectory, and the identification bag
holds the robot's topics from the start of the motion.

Processes: emulated workcell (cameras off) + envelope monitor (EnvelopeCell), recorder,
and the CLI itself, on one private localhost domain.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from sensor_msgs.msg import JointState
from twinloop_interfaces.msg import EnvelopeStatus

from twinloop_logging.bag_reader import Bag
from twinloop_ros.testing import RELIABLE, EnvelopeCell, stamp_s
from twinloop_ros.testing import NodeProcess, localhost_env

pytestmark = pytest.mark.ros
WATCHDOG_S = 0.25  # monitor watchdogs, as the demo's on a shared 2-core host


def start_cell(log_dir, **monitor_parameters) -> EnvelopeCell:
    cell = EnvelopeCell(log_dir, {"command_timeout_s": WATCHDOG_S, "joint_state_timeout_s": WATCHDOG_S,
                                  **monitor_parameters})
    cell.logs = log_dir
    cell.extra.append(NodeProcess("twinloop_logging.recorder_node", cell.domain_id,
                                  {"output_dir": str(log_dir / "bags")}, log_path=log_dir / "recorder.log"))
    return cell


def excite(cell, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "twinloop_builder.cli", "excite", *args,
                           "--output-dir", str(cell.logs / "bags")],
                          env=localhost_env(cell.domain_id), capture_output=True, text=True, timeout=180)


def test_joint_excitation_goes_through_the_monitor(tmp_path):
    cell = start_cell(tmp_path)
    try:
        sent = cell.probe.collect(JointState, "/twinloop/builder/command", RELIABLE)
        done = excite(cell, "--kind", "joints", "--split", "fit", "--duration", "4")
        assert done.returncode == 0, done.stderr + cell.monitor.log()
        bag_path = done.stdout.strip().splitlines()[-1]
        cell.probe.wait_for(lambda: len(sent) >= 1001, 5.0, "the probe's copy of the targets")

        # 4 s at 250 Hz (after a short move from the measured pose when the robot rests a
        # little off the start), every target forwarded unchanged, the monitor disarmed
        # after, no fault.
        assert 1001 <= len(sent) <= 1001 + 250, len(sent)
        out = {stamp_s(m.header.stamp): list(m.position) for _, m in cell.hardware_commands
               if m.header.frame_id == ""}
        out_stamps = np.array(sorted(out))
        for _, msg in sent:
            stamp = stamp_s(msg.header.stamp)
            nearest = out_stamps[np.argmin(np.abs(out_stamps - stamp))]
            assert abs(nearest - stamp) < 1e-6 and out[nearest] == list(msg.position), "a target was changed"
        status = cell.latest_status()
        assert status.state == EnvelopeStatus.STATE_DISARMED and status.fault == 0, status.reason

        # The bag holds every forwarded target and the joint states from before the first one.
        bag = Bag(bag_path)
        assert (bag.session.purpose, bag.session.split) == ("identification", "fit")
        recorded = [m.msg for m in bag.messages(["/joint_command"])]
        forwarded = [m for m in recorded if m.header.frame_id == ""]  # not the monitor's hold on disarm
        assert len(forwarded) == len(sent), (len(forwarded), len(recorded))
        states = bag.joint_states()
        first_target_ns = min(m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for _, m in sent)
        assert states.stamps_ns[0] < first_target_ns
        assert np.sum(states.stamps_ns >= first_target_ns) > 4.0 * 500 * 0.9  # 500 Hz, 10 % slack for load
    finally:
        cell.close()


def test_a_monitor_fault_ends_excite_with_its_reason(tmp_path):
    # Joint 2 may only accelerate at 0.5 rad/s^2 here: the multi-sine needs ~2.6 (seed 0).
    cell = start_cell(tmp_path, acceleration_limits=[0.5] * 7 + [1.0])
    try:
        done = excite(cell, "--kind", "joints", "--split", "fit", "--duration", "4")
        assert done.returncode == 3, done.stdout + done.stderr
        assert "the envelope monitor stopped the joint excitation" in done.stderr, done.stderr
        assert "acceleration" in done.stderr, done.stderr
        status = cell.latest_status()
        assert status.state == EnvelopeStatus.STATE_FAULT, status.reason
        # The robot holds where the fault happened: the hardware stream ends in hold commands.
        assert cell.hardware_commands[-1][1].header.frame_id != "", "the last command out was not a hold"
    finally:
        cell.close()


def test_pushes_go_through_the_monitor_and_move_the_box(tmp_path):
    cell = start_cell(tmp_path)
    try:
        done = excite(cell, "--kind", "pushes", "--split", "fit")
        assert done.returncode == 0, done.stderr + cell.monitor.log()
        # The configured pushes need more than the joint limits allow; they are slowed, and say so.
        assert done.stderr.count("played push") == 3 and "instead of 0.35" in done.stderr, done.stderr
        status = cell.latest_status()
        assert status.state == EnvelopeStatus.STATE_DISARMED and status.fault == 0, status.reason
        assert status.commands_rejected == 0 and status.commands_forwarded > 3 * 1500, status
        bag = Bag(done.stdout.strip().splitlines()[-1])
        boxes = [m.msg.pose.position for m in bag.messages(["/twinloop/emulated_workcell/box_pose"])]
        moved = np.hypot(boxes[-1].x - boxes[0].x, boxes[-1].y - boxes[0].y)
        assert moved > 0.03, moved  # three pushes of 4-5 cm past contact
    finally:
        cell.close()
