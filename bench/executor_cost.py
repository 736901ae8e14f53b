"""What an rclpy executor costs a node that takes the robot's joint states (500 Hz) and
two cameras' images (30 Hz each): messages delivered per second and the process's CPU,
for rclpy's MultiThreadedExecutor (4 threads), SingleThreadedExecutor and the
EventsExecutor, one after the other against the same emulated workcell (cameras on).

    .venv/bin/python bench/executor_cost.py [--seconds 15]

Prints one line per executor and the ratios to the EventsExecutor, measured in one run.
Each executor runs in a child process of its own (`--child KIND`).
"""
import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from twinloop_ros.process import NodeProcess, fresh_domain_id, localhost_env

KINDS = ("multi_threaded", "single_threaded", "events")


def child(kind: str, seconds: float) -> None:
    """Subscribe as the calibration server does during a live run, spin with `kind`, print counts and CPU."""
    import rclpy
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
    from rclpy.node import Node
    from sensor_msgs.msg import Image, JointState

    from twinloop_ros.qos import RELIABLE

    rclpy.init()
    node = Node(f"executor_cost_{kind}")
    counts = {"joint_states": 0, "images": 0}
    group = ReentrantCallbackGroup()

    def count(key: str):
        return lambda msg: counts.__setitem__(key, counts[key] + 1)
    node.create_subscription(JointState, "/joint_states", count("joint_states"), RELIABLE, callback_group=group)
    for camera in ("wrist_camera", "static_camera"):
        node.create_subscription(Image, f"/{camera}/color/image_raw", count("images"), 2, callback_group=group)
    if kind == "multi_threaded":
        executor = MultiThreadedExecutor(num_threads=4)
    elif kind == "single_threaded":
        executor = SingleThreadedExecutor()
    else:
        from rclpy.experimental import EventsExecutor
        executor = EventsExecutor()
    executor.add_node(node)

    def spin(duration_s: float) -> None:
        end = time.monotonic() + duration_s
        while time.monotonic() < end:
            executor.spin_once(timeout_sec=0.1)
    spin(5.0)  # discovery
    counts.update(joint_states=0, images=0)
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    spin(seconds)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.monotonic() - started
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / wall
    print(f"{counts['joint_states'] / wall:.1f} {counts['images'] / wall:.2f} {cpu:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=15.0, help="s measured per executor")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="executor-cost-"))
    domain = fresh_domain_id()
    workcell = NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"cameras_enabled": True},
                           log_path=logs / "workcell.log")
    results = {}
    try:
        time.sleep(8.0)  # start-up
        for kind in KINDS:
            out = subprocess.run([sys.executable, __file__, "--child", kind, "--seconds", str(args.seconds)],
                                 env=localhost_env(domain), capture_output=True, text=True, timeout=120)
            if out.returncode != 0:
                sys.exit(f"{kind}: exit {out.returncode}: {out.stderr.strip()[-500:]}")
            results[kind] = tuple(map(float, out.stdout.split()[-3:]))
    finally:
        workcell.stop()
    print(f"load average {os.getloadavg()[0]:.1f}; published: 500 joint states/s, 2 x 30 images/s")
    for kind, (joint_states, images, cpu) in results.items():
        print(f"{kind:16s} joint states {joint_states:6.1f}/s, images {images:5.1f}/s, CPU {cpu * 100:5.1f} % of a core")
    events = results["events"]
    for kind in KINDS[:2]:
        joint_states, _, cpu = results[kind]
        print(f"{kind} / events: joint states delivered x{joint_states / events[0]:.2f}, CPU x{cpu / events[2]:.2f}")


if __name__ == "__main__":
    if "--child" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--child", choices=KINDS)
        parser.add_argument("--seconds", type=float, default=15.0)
        options = parser.parse_args()
        child(options.child, options.seconds)
    else:
        main()
