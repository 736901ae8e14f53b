"""Policy runner loop period error at 250 Hz and 500 Hz (emulated workcell + runner).

The runner stamps each command in its timer callback; the period error is
|stamp[k+1] - stamp[k] - 1/rate|. Prints p50/p99 per rate and the p99 as a ratio of the
goal (1 ms at 250 Hz).

    .venv/bin/python bench/runner_period.py [--seconds 6]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from sensor_msgs.msg import JointState

from twinloop_policy.scripted import write_scripted_policy
from twinloop_ros.testing import RELIABLE, stamp_s
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id
from twinloop_twin.workcell import load_workcell


def measure(rate_hz: float, seconds: float, work: Path) -> np.ndarray:
    domain = fresh_domain_id()
    home = load_workcell().home_arm_positions
    policy = write_scripted_policy(work / f"p{rate_hz:.0f}", home, rate_hz=rate_hz, max_age_s=0.5)  # a loaded host must not end the run
    workcell = NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"cameras_enabled": False},
                           log_path=work / "workcell.log")
    runner = NodeProcess("twinloop_policy.policy_runner_node", domain,
                         {"policy_path": str(policy.folder), "autostart": True, "arm_monitor": False},
                         log_path=work / f"runner{rate_hz:.0f}.log")
    probe = RosProbe(domain)
    try:
        commands = probe.collect(JointState, "/twinloop/policy/command", RELIABLE,
                                 transform=lambda m: stamp_s(m.header.stamp))
        probe.wait_for(lambda: len(commands) > 100, 60.0, "runner commands")
        start = len(commands)
        time.sleep(seconds)
        stamps = np.array([s for _, s in commands[start:]])
    finally:
        probe.close()
        runner.stop()
        workcell.stop()
    return np.abs(np.diff(stamps) - 1.0 / rate_hz)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="runner-bench-"))
    for rate in (250.0, 500.0):
        error_ms = measure(rate, args.seconds, work) * 1e3
        p50, p99 = np.percentile(error_ms, 50), np.percentile(error_ms, 99)
        line = f"{rate:.0f} Hz, {len(error_ms)} periods: period error p50 {p50:.3f} ms, p99 {p99:.3f} ms"
        if rate == 250.0:
            line += f"; p99 / goal (1 ms) = {p99:.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
