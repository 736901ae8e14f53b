"""How late the envelope monitor's own callbacks run in its process while an excitation
streams through it (emulated workcell without cameras, monitor, recorder, `twinloop build
excite`, each a process, as `twinloop bringup` runs them).

Prints, measured in one run, with the load average: the monitor's CPU time, gaps between
its handled joint states and commands, and how late its watchdog ticks ran after they were
due (p50 / p99 / max, ms), the excite exit status and the monitor's fault, if any.

    .venv/bin/python bench/envelope_callbacks.py [--duration 8] [--control-rate 500]

The monitor is the shipped node with its callbacks timed (`--monitor`, run as a child).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from twinloop_ros.process import NodeProcess, fresh_domain_id, localhost_env

TIMES: dict = {"joint_state": [], "command": [], "tick_late": []}


def run_monitor() -> None:
    """The shipped monitor node, its callbacks timed; writes the times to $TIMES_OUT on exit."""
    from rclpy.timer import TimerInfo

    from twinloop_ros.node import make_executor, run_node
    from twinloop_safety.envelope_monitor_node import EnvelopeMonitorNode

    class TimedMonitor(EnvelopeMonitorNode):
        def on_joint_state(self, msg) -> None:
            TIMES["joint_state"].append(time.monotonic())
            super().on_joint_state(msg)

        def on_command(self, msg) -> None:
            TIMES["command"].append(time.monotonic())
            super().on_command(msg)

        def on_tick(self, info: TimerInfo) -> None:  # annotated with the class: rclpy passes it
            TIMES["tick_late"].append((info.actual_call_time - info.expected_call_time).nanoseconds * 1e-9)
            super().on_tick(info)

    started, cpu = time.monotonic(), time.process_time()
    try:
        run_node(TimedMonitor, executor=make_executor())
    finally:
        TIMES.update(cpu_s=time.process_time() - cpu, wall_s=time.monotonic() - started)
        Path(os.environ["TIMES_OUT"]).write_text(json.dumps(TIMES))


def stats_ms(values) -> str:
    v = np.asarray(values) * 1e3
    if not len(v):
        return "none"
    return f"p50 {np.percentile(v, 50):.1f}, p99 {np.percentile(v, 99):.1f}, max {v.max():.1f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=8.0, help="s of joint excitation")
    parser.add_argument("--watchdog", type=float, default=0.25, help="s, both monitor watchdogs")
    parser.add_argument("--control-rate", type=float, default=None, help="Hz, the monitor's watchdog rate "
                        "(default: the node's)")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="envelope-callbacks-"))
    domain = fresh_domain_id()
    times_out = logs / "times.json"
    workcell = NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"cameras_enabled": False},
                           log_path=logs / "workcell.log")
    monitor_log = open(logs / "monitor.log", "w")
    rate = ["-p", f"control_rate_hz:={args.control_rate}"] if args.control_rate else []
    monitor = subprocess.Popen(
        [sys.executable, __file__, "--monitor", "--ros-args", "-p", f"command_timeout_s:={args.watchdog}",
         "-p", f"joint_state_timeout_s:={args.watchdog}", *rate],
        env=localhost_env(domain, TIMES_OUT=str(times_out)), stdout=monitor_log, stderr=subprocess.STDOUT)
    recorder = NodeProcess("twinloop_logging.recorder_node", domain, {"output_dir": str(logs / "bags")},
                           log_path=logs / "recorder.log")
    try:
        time.sleep(6.0)  # start-up and discovery
        load_before = os.getloadavg()[0]
        excite = subprocess.run([sys.executable, "-m", "twinloop_builder.cli", "excite", "--kind", "joints",
                                 "--split", "fit", "--duration", str(args.duration), "--output-dir",
                                 str(logs / "bags")], env=localhost_env(domain), capture_output=True, text=True,
                                timeout=300)
        load_after = os.getloadavg()[0]
    finally:
        recorder.stop()
        monitor.send_signal(signal.SIGINT)
        monitor.wait(timeout=20)
        monitor_log.close()
        workcell.stop()
    times = json.loads(times_out.read_text())
    print(f"monitor CPU {times['cpu_s'] / times['wall_s'] * 100:.0f} % of a core over {times['wall_s']:.0f} s")
    faults = [line for line in (logs / "monitor.log").read_text().splitlines() if "envelope fault" in line]
    print(f"load average {load_before:.1f} before, {load_after:.1f} after; excite exit {excite.returncode}; "
          f"monitor faults: {faults or 'none'}")
    print(f"joint states handled: {len(times['joint_state'])}, gaps {stats_ms(np.diff(times['joint_state']))}")
    print(f"commands handled: {len(times['command'])}, gaps {stats_ms(np.diff(times['command']))}")
    print(f"watchdog ticks: {len(times['tick_late'])}, late after their due time {stats_ms(times['tick_late'])}")
    print(f"logs: {logs}")


if __name__ == "__main__":
    if "--monitor" in sys.argv:
        sys.argv.remove("--monitor")
        run_monitor()
    else:
        main()
