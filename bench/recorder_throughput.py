"""Recorder throughput: the highest offered load the recorder keeps with 0 drops.

Sweeps the offered load, one level after another: a 1 kHz JointState stream (the
hardware contract's robot state, published with the workcell's QoS) plus more and larger
image streams at 30 Hz (the emulated profile is level 1: 2 x 640x480 RGB + 2 x 640x480
depth, 92 MB/s), the streams spread over several publisher processes. Each level runs the
recorder node (`twinloop_logging.recorder_node`, autostarting the `all` profile) in its
own process; publishers start only once the recorder is subscribed and stop before it
stops, so everything sent should be in the bag. Per level it prints what was sent and
recorded per stream, the recorder's declared drops, its CPU, and the rosbags MCAP writer
writing the same offered mix in one process as fast as it can (the raw writer's ceiling,
measured in the same run). Not a test: run it alone, it loads the machine.

    .venv/bin/python bench/recorder_throughput.py [--duration 20] [--levels 1-5] [--compress]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

JOINT_STATES = "/bench/joint_states"
JOINT_RATE_HZ = 1000.0
IMAGE_RATE_HZ = 30.0


@dataclass(frozen=True)
class ImageStream:
    topic: str
    width: int
    height: int
    encoding: str  # rgb8 or 16UC1

    @property
    def frame_bytes(self) -> int:
        return self.width * self.height * (3 if self.encoding == "rgb8" else 2)


def _pair(name: str, width: int, height: int) -> list[ImageStream]:
    return [ImageStream(f"/bench/{name}/color", width, height, "rgb8"),
            ImageStream(f"/bench/{name}/depth", width, height, "16UC1")]


# Offered load rises level by level: more cameras, then larger ones.
LEVELS: dict[int, list[ImageStream]] = {
    1: _pair("wrist", 640, 480) + _pair("static", 640, 480),                       # the emulated profile
    2: _pair("wrist", 640, 480) + _pair("static", 640, 480) + _pair("side", 640, 480),
    3: _pair("wrist", 640, 480) + _pair("static", 640, 480) + _pair("side", 640, 480) + _pair("top", 640, 480),
    4: _pair("wrist", 1280, 720) + _pair("static", 640, 480) + _pair("side", 640, 480),
    5: _pair("wrist", 1280, 720) + _pair("static", 1280, 720),
    6: _pair("wrist", 1280, 720) + _pair("static", 1280, 720) + _pair("side", 640, 480) + _pair("top", 640, 480),
}
STREAMS_PER_PUBLISHER = 2  # image streams per publisher process


def offered_mb_s(streams: list[ImageStream]) -> float:
    joint_state_bytes = 400  # a 9-joint JointState, serialized
    return (sum(s.frame_bytes for s in streams) * IMAGE_RATE_HZ + joint_state_bytes * JOINT_RATE_HZ) / 1e6


# ---------------------------------------------------------------- publisher process
def publish(spec: dict) -> None:
    """Child process: publish the given streams for spec['duration'] s once the recorder
    subscribes; print what was sent (JSON)."""
    import numpy as np
    import rclpy
    from rclpy._rclpy_pybind11 import RCLError
    from sensor_msgs.msg import Image, JointState
    from twinloop_ros.qos import IMAGES, STREAM

    rclpy.init()
    node = rclpy.create_node(f"bench_publisher_{os.getpid()}")
    rng = np.random.default_rng(0)
    messages, rates, pubs = {}, {}, {}
    if spec["joint_states"]:
        pubs[JOINT_STATES] = node.create_publisher(JointState, JOINT_STATES, STREAM)
        messages[JOINT_STATES] = JointState(name=[f"panda_joint{i}" for i in range(1, 8)], position=[0.1] * 7,
                                            velocity=[0.0] * 7, effort=[0.0] * 7)
        rates[JOINT_STATES] = JOINT_RATE_HZ
    for raw in spec["images"]:
        stream = ImageStream(**raw)
        pubs[stream.topic] = node.create_publisher(Image, stream.topic, IMAGES)
        pixels = (rng.integers(0, 255, stream.frame_bytes, dtype=np.uint8) if stream.encoding == "rgb8"
                  else rng.integers(300, 2000, stream.frame_bytes // 2, dtype=np.uint16).view(np.uint8))
        messages[stream.topic] = Image(height=stream.height, width=stream.width, encoding=stream.encoding,
                                       step=stream.frame_bytes // stream.height, data=pixels.tobytes())
        rates[stream.topic] = IMAGE_RATE_HZ
    deadline = time.monotonic() + 60.0
    while any(p.get_subscription_count() == 0 for p in pubs.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the recorder's reliable sessions settle
    sent = {t: 0 for t in pubs}
    refused = {t: 0 for t in pubs}  # Fast DDS refuses a reliable write whose history stays full
    start = time.monotonic()
    next_due = {t: start for t in pubs}
    while (now := time.monotonic()) - start < spec["duration"]:
        for topic, rate in rates.items():
            if now >= next_due[topic]:  # late ticks publish what they missed: the offered load is kept
                msg = messages[topic]
                msg.header.stamp = node.get_clock().now().to_msg()
                try:
                    pubs[topic].publish(msg)
                    sent[topic] += 1
                except RCLError:
                    refused[topic] += 1
                next_due[topic] += 1.0 / rate
        time.sleep(max(0.0, min(next_due.values()) - time.monotonic()))
    seconds = time.monotonic() - start
    time.sleep(2.0)  # reliable delivery of the last samples
    print(json.dumps({"sent": sent, "refused": refused, "seconds": seconds}), flush=True)
    node.destroy_node()
    rclpy.shutdown()


# ---------------------------------------------------------------- measurements
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raw_writer_mb_s(streams: list[ImageStream], out: Path, seconds: float = 5.0, compress: bool = False) -> float:
    """rosbags' Writer (MCAP) writing `seconds` of the offered mix, as fast as it can, in one process."""
    import numpy as np
    from rclpy.serialization import serialize_message
    from rosbags.rosbag2 import StoragePlugin, Writer
    from sensor_msgs.msg import Image, JointState

    from twinloop_logging.typedefs import TypeResolver

    resolver = TypeResolver()
    joint = serialize_message(JointState(name=[f"panda_joint{i}" for i in range(1, 8)], position=[0.1] * 7,
                                         velocity=[0.0] * 7, effort=[0.0] * 7))
    frames = {s.topic: serialize_message(Image(height=s.height, width=s.width, encoding=s.encoding,
                                               step=s.frame_bytes // s.height,
                                               data=np.random.default_rng(0).integers(
                                                   0, 255, s.frame_bytes, dtype=np.uint8).tobytes()))
              for s in streams}
    schedule = [(k / JOINT_RATE_HZ, JOINT_STATES, joint) for k in range(int(seconds * JOINT_RATE_HZ))]
    schedule += [(k / IMAGE_RATE_HZ, s.topic, frames[s.topic]) for s in streams
                 for k in range(int(seconds * IMAGE_RATE_HZ))]
    schedule.sort(key=lambda item: item[0])
    started = time.perf_counter()
    writer = Writer(out, version=9, storage_plugin=StoragePlugin.MCAP)
    if compress:
        writer.set_compression(Writer.CompressionMode.MESSAGE, Writer.CompressionFormat.ZSTD)
    with writer:
        connections = {}
        for topic, msgtype in [(JOINT_STATES, "sensor_msgs/msg/JointState")] + \
                [(s.topic, "sensor_msgs/msg/Image") for s in streams]:
            definition = resolver.definition(msgtype)
            connections[topic] = writer.add_connection(topic, msgtype, msgdef=definition.msgdef, rihs01=definition.rihs01)
        for t, topic, data in schedule:
            writer.write(connections[topic], int(t * 1e9), data)
    elapsed = time.perf_counter() - started
    return sum(len(d) for _, _, d in schedule) / elapsed / 1e6


@dataclass
class LevelResult:
    level: int
    offered_mb_s: float
    recorded_mb_s: float
    recorder_cpu: float  # fraction of one core
    raw_writer_mb_s: float
    rows: list[tuple[str, int, int, object, int]]  # topic, sent, recorded, declared dropped, refused by DDS

    @property
    def lost(self) -> int:
        return sum(max(0, sent - recorded) for _, sent, recorded, *_ in self.rows)

    @property
    def refused(self) -> int:
        return sum(row[4] for row in self.rows)

    @property
    def joint_states_lost(self) -> int:
        return sum(max(0, sent - recorded) for topic, sent, recorded, *_ in self.rows if topic == JOINT_STATES)


def run_level(level: int, duration_s: float, work: Path, compress: bool,
              recorder_parameters: dict | None = None) -> LevelResult:
    from twinloop_logging.bag_reader import open_bag
    from twinloop_ros.process import NodeProcess, fresh_domain_id, localhost_env

    streams = LEVELS[level]
    domain = fresh_domain_id()
    session = f"level{level}_{int(time.time())}"
    recorder = NodeProcess("twinloop_logging.recorder_node", domain,
                           {"output_dir": str(work), "autostart_profile": "all", "autostart_session_id": session,
                            "compress": compress, **(recorder_parameters or {})},
                           log_path=work / f"recorder_{session}.log")
    specs = [{"joint_states": True, "images": [], "duration": duration_s}]
    for i in range(0, len(streams), STREAMS_PER_PUBLISHER):
        specs.append({"joint_states": False, "images": [vars(s) for s in streams[i:i + STREAMS_PER_PUBLISHER]],
                      "duration": duration_s})
    publishers = []
    try:  # a level that fails half-way leaves no recorder or publisher running
        publishers = [subprocess.Popen([sys.executable, __file__, "--publish", json.dumps(spec)],
                                       env=localhost_env(domain), stdout=subprocess.PIPE, text=True) for spec in specs]
        cpu0, t0 = cpu_seconds(recorder.process.pid), time.monotonic()
        reports = [json.loads(p.communicate(timeout=duration_s + 180)[0].strip().splitlines()[-1]) for p in publishers]
        cpu = cpu_seconds(recorder.process.pid) - cpu0
        wall = time.monotonic() - t0
    finally:
        for publisher in publishers:
            if publisher.poll() is None:
                publisher.kill()
        recorder.stop(signal.SIGINT, timeout_s=180)
    sent = {topic: count for report in reports for topic, count in report["sent"].items()}
    refused = {topic: count for report in reports for topic, count in report["refused"].items()}
    seconds = max(report["seconds"] for report in reports)
    with open_bag(work / session) as bag:
        stats = bag.topic_stats
        rows = [(topic, count, bag.topics[topic].count if topic in bag.topics else 0,
                 stats.get(topic, {}).get("dropped_estimate", "-"), refused[topic]) for topic, count in sent.items()]
        data_bytes = sum(p.stat().st_size for p in (work / session).glob("*.mcap"))
    for path in (work / session).glob("*.mcap"):
        path.unlink()  # levels write gigabytes; the counts are read
    # From a clean page cache: otherwise the raw writer waits on the recording's writeback.
    os.sync()
    raw = raw_writer_mb_s(streams, work / f"raw_{session}", compress=compress)
    shutil.rmtree(work / f"raw_{session}")
    return LevelResult(level, offered_mb_s(streams), data_bytes / seconds / 1e6, cpu / wall, raw, rows)


def print_level(result: LevelResult) -> None:
    print(f"level {result.level}: offered {result.offered_mb_s:.1f} MB/s, recorded {result.recorded_mb_s:.1f} MB/s, "
          f"recorder CPU {result.recorder_cpu * 100:.0f} % of one core, raw rosbags MCAP writer "
          f"{result.raw_writer_mb_s:.0f} MB/s (offered / raw {result.offered_mb_s / result.raw_writer_mb_s:.2f})")
    print(f"  {'topic':24s} {'sent':>7s} {'recorded':>9s} {'dropped (declared)':>19s} {'refused by DDS':>15s}")
    for topic, sent, recorded, declared, refused in result.rows:
        print(f"  {topic:24s} {sent:7d} {recorded:9d} {declared!s:>19s} {refused:15d}")
    print(f"  lost: {result.lost} ({result.joint_states_lost} joint states); publishes refused: {result.refused}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=20.0, help="s per level")
    parser.add_argument("--levels", default=f"1-{max(LEVELS)}", help="e.g. 1-4 or 1,3,5")
    parser.add_argument("--compress", action="store_true")
    parser.add_argument("--recorder-param", action="append", default=[], metavar="NAME=VALUE",
                        help="a recorder parameter for every level (e.g. queue_depth=100)")
    parser.add_argument("--publish", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.publish:
        publish(json.loads(args.publish))
        return
    if "-" in args.levels:
        low, high = map(int, args.levels.split("-"))
        levels = list(range(low, high + 1))
    else:
        levels = [int(v) for v in args.levels.split(",")]
    work = Path(tempfile.mkdtemp(prefix="recorder_bench_"))
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; {args.duration:.0f} s per level, "
          f"compress={args.compress}, recorder parameters {args.recorder_param or 'as shipped'}; bags in {work}",
          flush=True)
    results = []
    for level in levels:
        results.append(run_level(level, args.duration, work, args.compress,
                                 dict(p.split("=", 1) for p in args.recorder_param)))
        print_level(results[-1])
    kept = [r for r in results if r.lost == 0 and r.refused == 0 and all(row[3] in (0, "-") for row in r.rows)]
    best = max(kept, key=lambda r: r.offered_mb_s, default=None)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print("highest offered load kept with 0 drops: "
          + (f"{best.offered_mb_s:.1f} MB/s (level {best.level})" if best else "none"))


if __name__ == "__main__":
    main()
