"""Envelope monitor latency across processes (emulated workcell + monitor + probe).

Prints, measured in one run:
  reaction: violation published (probe) -> hold command out of the monitor (its stamp), p50/p99,
            and as a ratio of the goal (2 control periods at 500 Hz = 4 ms);
  added:    extra delivery delay of the monitor on the command path: probe receive time of a
            command on /joint_command minus on /twinloop/policy/command, p50/p99.

    .venv/bin/python bench/envelope_latency.py [--cycles 40] [--seconds 5]
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np
from sensor_msgs.msg import JointState

from twinloop_ros.testing import COMMANDED, RELIABLE, EnvelopeCell, stamp_s

CONTROL_PERIOD_S = 1.0 / 500.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    cell = EnvelopeCell(Path(tempfile.mkdtemp(prefix="envelope-bench-")),
                        {"command_timeout_s": 0.5, "joint_state_timeout_s": 0.5})
    try:
        targets = dict(cell.home)
        cell.prepare()
        reactions = []
        for _ in range(args.cycles):
            cell.reset_fault()
            cell.set_armed(True)
            cell.command({j: targets[j] for j in COMMANDED})
            time.sleep(0.05)
            sent = time.time()
            cell.command({**{j: targets[j] for j in COMMANDED}, "panda_joint1": math.nan})
            cell.probe.wait_for(lambda: cell.holds_after(sent), 2.0, "the hold")
            reactions.append(stamp_s(cell.holds_after(sent)[0].header.stamp) - sent)
        cell.reset_fault()
        cell.set_armed(True)
        inbound = cell.probe.collect(JointState, "/twinloop/policy/command", RELIABLE)
        time.sleep(0.5)
        begin = time.monotonic()
        while time.monotonic() - begin < args.seconds:
            cell.command({j: targets[j] for j in COMMANDED})
            time.sleep(0.004)
        cell.set_armed(False)
        time.sleep(0.3)
        arrived_in = {stamp_s(m.header.stamp): t for t, m in inbound}
        added = [t - arrived_in[stamp_s(m.header.stamp)] for t, m in cell.hardware_commands
                 if m.header.frame_id == "" and stamp_s(m.header.stamp) in arrived_in]
    finally:
        cell.close()
    r, a = np.array(reactions) * 1e3, np.array(added) * 1e3
    goal = 2 * CONTROL_PERIOD_S * 1e3
    print(f"reaction (violation published -> hold out), {len(r)} faults: p50 {np.percentile(r, 50):.2f} ms, "
          f"p99 {np.percentile(r, 99):.2f} ms; p99 / goal ({goal:.0f} ms) = {np.percentile(r, 99) / goal:.2f}")
    print(f"added latency of the monitor, {len(a)} commands: p50 {np.percentile(a, 50):.2f} ms, "
          f"p99 {np.percentile(a, 99):.2f} ms")


if __name__ == "__main__":
    main()
