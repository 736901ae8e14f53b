"""Recorder throughput: 1 kHz JointState + 2 x 30 Hz 640x480 RGB + 2 x 30 Hz 640x480 depth
from a synthetic publisher in another process, recorded by the recorder node.

Prints drops, MB/s, recorder CPU, and the ratio of the recorder's throughput to rosbags'
own MCAP writer writing the same serialized messages in one process (from the bag just
recorded). Not a test: run it alone, it loads the machine.

    .venv/bin/python bench/recorder_throughput.py [--duration 60] [--compress]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STREAMS = {"/bench/joint_states": 1000.0, "/bench/wrist/color": 30.0, "/bench/static/color": 30.0,
           "/bench/wrist/depth": 30.0, "/bench/static/depth": 30.0}


def publish(duration_s: float) -> None:
    """Child process: publish the streams for duration_s, print what was sent (JSON)."""
    import numpy as np
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image, JointState
    rclpy.init()
    node = rclpy.create_node("bench_publisher")
    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    pubs = {t: node.create_publisher(JointState if "joint" in t else Image, t, qos) for t in STREAMS}
    rng = np.random.default_rng(0)
    color = Image(height=480, width=640, encoding="rgb8", step=1920,
                  data=bytes(rng.integers(0, 255, 640 * 480 * 3, dtype=np.uint8)))
    depth = Image(height=480, width=640, encoding="16UC1", step=1280,
                  data=bytes(rng.integers(300, 2000, 640 * 480, dtype=np.uint16).tobytes()))
    joints = JointState(name=[f"panda_joint{i}" for i in range(1, 8)], position=[0.1] * 7, velocity=[0.0] * 7,
                        effort=[0.0] * 7)
    time.sleep(3.0)  # the recorder discovers the topics (and subscribes) first
    sent = {t: 0 for t in STREAMS}
    start = time.monotonic()
    next_due = {t: start for t in STREAMS}
    while (now := time.monotonic()) - start < duration_s:
        for topic, rate in STREAMS.items():
            if now >= next_due[topic]:
                msg = joints if "joint" in topic else (color if "color" in topic else depth)
                msg.header.stamp = node.get_clock().now().to_msg()
                pubs[topic].publish(msg)
                sent[topic] += 1
                next_due[topic] += 1.0 / rate
        time.sleep(max(0.0, min(next_due.values()) - time.monotonic()))
    time.sleep(1.0)
    print(json.dumps({"sent": sent, "seconds": time.monotonic() - start - 1.0}), flush=True)
    node.destroy_node()
    rclpy.shutdown()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raw_writer_mb_s(bag_path: Path, out: Path) -> float:
    """rosbags' Writer (MCAP) writing the recorded serialized messages, in one process."""
    from rosbags.highlevel import AnyReader
    from rosbags.rosbag2 import StoragePlugin, Writer
    with AnyReader([bag_path]) as reader:
        connections = {c.id: c for c in reader.connections}
        messages = [(c.id, t, bytes(d)) for c, t, d in reader.messages()]
    start = time.perf_counter()
    with Writer(out, version=9, storage_plugin=StoragePlugin.MCAP) as writer:
        mapped = {i: writer.add_connection(c.topic, c.msgtype, msgdef=c.msgdef.data, rihs01=c.digest)
                  for i, c in connections.items()}
        for cid, stamp, data in messages:
            writer.write(mapped[cid], stamp, data)
    seconds = time.perf_counter() - start
    return sum(len(d) for _, _, d in messages) / seconds / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--compress", action="store_true")
    parser.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        publish(args.duration)
        return
    from twinloop_logging.bag_reader import open_bag
    from twinloop_ros.testing import NodeProcess, fresh_domain_id, localhost_env
    domain = fresh_domain_id()
    tmp = Path(tempfile.mkdtemp(prefix="recorder_bench_"))
    recorder = NodeProcess("twinloop_logging.recorder_node", domain,
                           {"output_dir": str(tmp), "autostart_profile": "all", "autostart_session_id": "bench",
                            "compress": args.compress}, log_path=tmp / "recorder.log")
    publisher = subprocess.Popen([sys.executable, __file__, "--publish", "--duration", str(args.duration)],
                                 env=localhost_env(domain), stdout=subprocess.PIPE, text=True)
    cpu0, t0 = cpu_seconds(recorder.process.pid), time.monotonic()
    report = json.loads(publisher.communicate(timeout=args.duration + 120)[0].strip().splitlines()[-1])
    cpu = cpu_seconds(recorder.process.pid) - cpu0
    wall = time.monotonic() - t0
    recorder.stop(signal.SIGINT, timeout_s=120)
    with open_bag(tmp / "bench") as bag:
        stats = bag.topic_stats
        counts = {t: bag.topics[t].count if t in bag.topics else 0 for t in STREAMS}
        data_bytes = sum(p.stat().st_size for p in (tmp / "bench").glob("*.mcap"))
    recorded_mb_s = data_bytes / report["seconds"] / 1e6
    raw = raw_writer_mb_s(tmp / "bench", tmp / "raw")
    print(f"duration {report['seconds']:.1f} s, compress={args.compress}")
    print(f"{'topic':24s} {'sent':>7s} {'recorded':>9s} {'dropped (declared)':>19s}")
    for topic in STREAMS:
        print(f"{topic:24s} {report['sent'][topic]:7d} {counts[topic]:9d} "
              f"{stats.get(topic, {}).get('dropped_estimate', '-'):>19}")
    print(f"recorder: {recorded_mb_s:.1f} MB/s written, CPU {cpu / wall * 100:.0f} % of one core")
    print(f"rosbags MCAP writer, same messages, one process: {raw:.1f} MB/s")
    print(f"ratio recorder / raw writer: {recorded_mb_s / raw:.2f} "
          "(the recorder is paced by the publisher: a ratio < 1 with 0 drops means spare capacity)")
    print(f"bag: {tmp / 'bench'}")


if __name__ == "__main__":
    main()
