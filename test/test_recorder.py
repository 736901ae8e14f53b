"""The recorder node over real DDS: recording the emulated workcell, sessions, drops,
crash safety (SIGKILL + repair, SIGTERM), storage full, and refused requests.

The recorder and the workcell run as subprocesses; the test publishes and calls the
services from its own rclpy context, each test on its own ROS domain.
"""
from __future__ import annotations

import hashlib
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosbags.highlevel import AnyReader
from sensor_msgs.msg import Image, JointState
from twinloop_interfaces.msg import ErrorCode, RecordingStatus, SessionId
from twinloop_interfaces.srv import AnnotateRecording, StartRecording, StopRecording

from twinloop_logging.bag_reader import BagCorruptError, open_bag
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id, localhost_env

pytestmark = pytest.mark.ros

LATCHED = QoSProfile(depth=1, durability=DurabilityPolicy.TRANSIENT_LOCAL, reliability=ReliabilityPolicy.RELIABLE)
RELIABLE = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
WORKCELL = "twinloop_sim.emulated_workcell_node"
RECORDER = "twinloop_logging.recorder_node"
CLI = [str(Path(sys.executable).with_name("twinloop")), "bag"]  # `twinloop bag`, as a user runs it
COUNTER = "/twinloop/test/counter"
STARTUP_S = 30.0


def call(probe: RosProbe, srv_type, name: str, request, timeout_s: float = 20.0):
    client = probe.node.create_client(srv_type, name)
    assert client.wait_for_service(timeout_sec=STARTUP_S), f"{name} not available"
    future = client.call_async(request)
    probe.wait_for(future.done, timeout_s, f"{name} response")
    return future.result()


def counter_msg(i: int, probe: RosProbe) -> JointState:
    msg = JointState(name=["counter"], position=[float(i)], velocity=[0.0], effort=[0.0])
    msg.header.stamp = probe.node.get_clock().now().to_msg()
    return msg


def publish_counter(probe: RosProbe, count: int, rate_hz: float) -> list[float]:
    """Publish `count` counter messages once the recorder subscribes; returns send times."""
    publisher = probe.node.create_publisher(JointState, COUNTER, RELIABLE)
    probe.wait_for(lambda: probe.node.count_subscribers(COUNTER) > 0, 20.0, "the recorder to subscribe")
    time.sleep(0.5)  # let the reliable match complete both ways
    sent = []
    for i in range(count):
        publisher.publish(counter_msg(i, probe))
        sent.append(time.monotonic())
        time.sleep(1.0 / rate_hz)
    return sent


def counter_values(bag_path) -> list[float]:
    with open_bag(bag_path) as bag:
        return [float(m.msg.position[0]) for m in bag.messages([COUNTER])]


def start_request(session_id: str, profile: str = "trial", **fields) -> StartRecording.Request:
    return StartRecording.Request(profile=profile, session=SessionId(session_id=session_id, purpose="trial",
                                                                     split="held_out"), **fields)


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    """Emulated workcell + recorder + probe. Joint states at 250 Hz and cameras at 5 Hz to
    spare the 2 shared CPU cores: the workcell's KEEP_LAST(10) history then covers 40 ms of
    recorder latency (at 500 Hz, 20 ms, which a host loaded by parallel test runs exceeds;
    bench/recorder_throughput.py measures the full rates)."""
    tmp = tmp_path_factory.mktemp("recorder")
    domain = fresh_domain_id()
    workcell = NodeProcess(WORKCELL, domain, {"seed": 3, "camera_rate_hz": 5.0, "joint_state_rate_hz": 250.0}, log_path=tmp / "workcell.log")
    recorder = NodeProcess(RECORDER, domain, {"output_dir": str(tmp / "bags")}, log_path=tmp / "recorder.log")
    probe = RosProbe(domain)
    joint_states = probe.collect(JointState, "/joint_states")
    try:
        probe.wait_for(lambda: len(joint_states) > 50, STARTUP_S, "joint states")
    except TimeoutError:
        probe.close()
        workcell.stop()
        recorder.stop()
        raise AssertionError(f"workcell did not start:\n{workcell.log()}")
    yield {"probe": probe, "joint_states": joint_states, "tmp": tmp, "recorder": recorder}
    probe.close()
    assert recorder.stop() == 0, recorder.log()
    workcell.stop()


def test_records_the_emulated_workcell(cell):
    probe = cell["probe"]
    status = probe.collect(RecordingStatus, "/recorder/status", LATCHED)
    started = call(probe, StartRecording, "/recorder/start", start_request(
        "workcell", twin_version="emulated/v0", policy_version="none", operator_note="recorder test"))
    assert started.error.code == ErrorCode.NONE, started.error.message
    bag_path = Path(started.bag_path)
    published = 300
    publish_counter(probe, published, rate_hz=200.0)
    assert call(probe, AnnotateRecording, "/recorder/annotate",
                AnnotateRecording.Request(note="pushed the box")).error.code == ErrorCode.NONE
    probe.wait_for(lambda: any(s.recording and any(t.topic.endswith("image_raw") and t.received > 2 for t in s.topics)
                               for _, s in status), 20.0, "status with camera images")
    stopped = call(probe, StopRecording, "/recorder/stop", StopRecording.Request(), timeout_s=60.0)
    assert stopped.error.code == ErrorCode.NONE, stopped.error.message
    stats = {t.topic: t for t in stopped.status.topics}
    print({t: (s.received, s.expected, s.dropped_estimate) for t, s in stats.items()})
    assert {"/joint_states", "/tf", "/tf_static", "/robot_description", COUNTER,
            "/wrist_camera/color/image_raw", "/static_camera/depth/image_rect_raw"} <= set(stats)
    # The declared drop count is 0 for every topic, and received == expected.
    bad = {t: (s.received, s.expected, s.dropped_estimate) for t, s in stats.items()
           if s.dropped_estimate or s.received != s.expected}
    assert not bad, f"drops (received, expected, dropped): {bad}\n{cell['recorder'].log()[-2000:]}"

    # What the bag holds equals what was published: the counter exactly...
    assert counter_values(bag_path) == [float(i) for i in range(published)]
    with open_bag(bag_path) as bag:
        counts = {t.name: t.count for t in bag.topics.values()}
        assert all(counts[t] == s.received for t, s in stats.items())
        # ...the joint states fill the workcell's 4 ms stamp grid from first to last (the
        # publisher's own account of what it sent), and equal what the probe received.
        series = bag.joint_states()
        steps = np.diff(series.stamps_ns)
        # Every stamp on the 4 ms grid; a longer step is the workcell skipping ahead after a
        # stall of this loaded host (its lag_skips), which its sequence numbers confirm: no drop.
        assert np.all(steps % 4_000_000 == 0) and np.mean(steps == 4_000_000) > 0.95, np.unique(steps)
        probe_by_stamp = {(m.header.stamp.sec, m.header.stamp.nanosec): m.position for _, m in cell["joint_states"]}
        matched = 0
        for stamp, position in zip(series.stamps_ns, series.position):
            key = (int(stamp // 10**9), int(stamp % 10**9))
            if key in probe_by_stamp:
                np.testing.assert_array_equal(position, probe_by_stamp[key])
                matched += 1
        assert matched > 0.5 * len(series.stamps_ns)  # the probe, in Python too, may miss some itself
        frames = bag.images("/wrist_camera/color/image_raw", max_frames=2)
        assert frames.frames.shape[1:] == (480, 640, 3) and frames.frames.std() > 10.0
        session = bag.session
        assert (session.session_id, session.purpose, session.split, session.twin_version, session.profile) == (
            "workcell", "trial", "held_out", "emulated/v0", "trial")
        assert [a.note for a in session.annotations] == ["pushed the box"]
        assert bag.topic_stats["/joint_states"]["dropped_estimate"] == 0

    # rosbags and the mcap tools (decoding with the stored schemas only) agree on it.
    with AnyReader([bag_path]) as reader:
        assert {c.topic: c.msgcount for c in reader.connections} == counts
    mcap_counts: dict[str, int] = {}
    for path in sorted(bag_path.glob("*.mcap")):
        with open(path, "rb") as stream:
            reader = make_reader(stream, decoder_factories=[DecoderFactory()])
            for _, channel, _, decoded in reader.iter_decoded_messages():
                mcap_counts[channel.topic] = mcap_counts.get(channel.topic, 0) + 1
                if channel.topic == COUNTER:
                    assert decoded.position[0] == mcap_counts[COUNTER] - 1
    assert mcap_counts == {t: n for t, n in counts.items() if n}


def test_refused_requests_lose_nothing(cell):
    probe = cell["probe"]
    bag_path = cell["tmp"] / "bags" / "workcell"
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in bag_path.iterdir()}
    again = call(probe, StartRecording, "/recorder/start", start_request("workcell"))
    assert again.error.code == ErrorCode.INVALID_ARGUMENT and "exists already" in again.error.message
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in bag_path.iterdir()} == before
    unknown = call(probe, StartRecording, "/recorder/start", start_request("x", profile="everything"))
    assert unknown.error.code == ErrorCode.INVALID_ARGUMENT and "'everything'" in unknown.error.message
    assert "calibration" in unknown.error.message
    bad_split = call(probe, StartRecording, "/recorder/start", StartRecording.Request(
        profile="trial", session=SessionId(purpose="trial", split="test")))
    assert bad_split.error.code == ErrorCode.INVALID_ARGUMENT and "held_out" in bad_split.error.message
    assert call(probe, StopRecording, "/recorder/stop", StopRecording.Request()).error.code == ErrorCode.NOT_READY
    assert call(probe, AnnotateRecording, "/recorder/annotate",
                AnnotateRecording.Request(note="x")).error.code == ErrorCode.NOT_READY


def _autostarted_recorder(tmp_path, domain: int, **parameters) -> NodeProcess:
    params = {"output_dir": str(tmp_path), "autostart_profile": "identification",
              "autostart_session_id": "crash", "flush_interval_s": 0.3, **parameters}
    return NodeProcess(RECORDER, domain, params, log_path=tmp_path / "recorder.log")


def test_sigkill_then_repair_keeps_every_complete_chunk(tmp_path):
    domain = fresh_domain_id()
    recorder = _autostarted_recorder(tmp_path, domain)
    probe = RosProbe(domain)
    try:
        sent = publish_counter(probe, 600, rate_hz=200.0)
        recorder.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        recorder.stop()
    finally:
        probe.close()
    bag_path = tmp_path / "crash"
    with pytest.raises(BagCorruptError, match="twinloop bag repair"):
        counter_values(bag_path)
    repaired = subprocess.run([*CLI, "repair", str(bag_path)], capture_output=True, text=True, timeout=60)
    assert repaired.returncode == 0, repaired.stderr
    values = counter_values(bag_path)
    # Everything up to the last flushed chunk, without a hole: flushes come every 0.3 s,
    # so all that was sent more than 1.5 s before the kill (generous for a loaded host) is there.
    assert values == [float(i) for i in range(len(values))]
    settled = sum(1 for t in sent if t < killed - 1.5)
    assert len(values) >= settled > 100, (len(values), settled)
    with open_bag(bag_path) as bag:
        assert bag.session.session_id == "crash" and bag.session.purpose == "demonstration"
    assert any(p.name.endswith(".mcap.damaged") for p in bag_path.iterdir())


def test_sigterm_finalizes_the_bag(tmp_path):
    domain = fresh_domain_id()
    recorder = _autostarted_recorder(tmp_path, domain, split_size_bytes=20000, chunk_size_bytes=8192)
    probe = RosProbe(domain)
    try:
        publish_counter(probe, 400, rate_hz=400.0)
        time.sleep(1.0)
    finally:
        probe.close()
    assert recorder.stop(signal.SIGTERM) == 0, recorder.log()
    bag_path = tmp_path / "crash"
    files = sorted(bag_path.glob("*.mcap"))
    assert len(files) >= 3, files  # split by size while recording
    for path in files:  # every file finalized: summary present
        with open(path, "rb") as stream:
            assert make_reader(stream).get_summary() is not None
    assert counter_values(bag_path) == [float(i) for i in range(400)]


def test_storage_full_stops_cleanly_and_keeps_what_was_written(tmp_path):
    domain = fresh_domain_id()
    limit = 3_000_000  # bytes per file: RLIMIT_FSIZE makes writes past it fail (EFBIG)
    command = [sys.executable, "-m", RECORDER, "--ros-args", "-p", f"output_dir:={tmp_path}",
               "-p", "chunk_size_bytes:=100000", "-p", "flush_interval_s:=0.2"]
    log = open(tmp_path / "recorder.log", "w")
    process = subprocess.Popen(command, env=localhost_env(domain), stdout=log, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    probe = RosProbe(domain)
    try:
        status = probe.collect(RecordingStatus, "/recorder/status", LATCHED)
        started = call(probe, StartRecording, "/recorder/start", start_request("full", profile="identification"),
                       timeout_s=60.0)
        assert started.error.code == ErrorCode.NONE, started.error.message
        publisher = probe.node.create_publisher(Image, "/twinloop/test/image", RELIABLE)
        probe.wait_for(lambda: probe.node.count_subscribers("/twinloop/test/image") > 0, 20.0, "subscription")
        time.sleep(0.5)
        pixels = bytes(np.random.default_rng(0).integers(0, 255, 640 * 480 * 3, dtype=np.uint8))
        for i in range(12):  # 12 x 0.92 MB: far past the limit
            publisher.publish(Image(height=480, width=640, encoding="rgb8", step=1920, data=pixels))
            time.sleep(0.1)
        probe.wait_for(lambda: any("storage full" in s.message and not s.recording for _, s in status),
                       20.0, "the recorder to report storage full")
        stopped = call(probe, StopRecording, "/recorder/stop", StopRecording.Request())
        assert stopped.error.code == ErrorCode.NOT_READY  # already stopped by itself
    finally:
        probe.close()
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0, (tmp_path / "recorder.log").read_text()
        log.close()
    final = [s for _, s in status if "storage full" in s.message][-1]
    assert "twinloop bag repair" in final.message
    image_stats = next(t for t in final.topics if t.topic == "/twinloop/test/image")
    assert image_stats.dropped_estimate > 0 and image_stats.received >= 1
    bag_path = tmp_path / "full"
    assert subprocess.run([*CLI, "repair", str(bag_path)], capture_output=True, timeout=60).returncode == 0
    with open_bag(bag_path) as bag:
        kept = bag.topics["/twinloop/test/image"].count
        assert 1 <= kept <= image_stats.received
        assert all(f == pixels for _, _, f in ((0, 0, m.msg.data.tobytes()) for m in bag.messages(["/twinloop/test/image"])))


def test_bag_names_say_purpose_kind_and_split(tmp_path):
    """A generated session id ends in the split; an id made by session_name (what
    `twinloop build excite` asks for) also names the kind of excitation."""
    from twinloop_logging.session import session_name
    from twinloop_ros.clients import RecorderClient

    domain = fresh_domain_id()
    recorder = NodeProcess(RECORDER, domain, {"output_dir": str(tmp_path / "bags")}, log_path=tmp_path / "recorder.log")
    probe = RosProbe(domain)
    names = {}
    try:
        client = RecorderClient(probe.node)
        for kind, split, session_id in (("", "held_out", ""), ("", "fit", ""),
                                        ("joints", "fit", session_name("identification", "fit", kind="joints")),
                                        ("pushes", "held_out", session_name("identification", "held_out",
                                                                             kind="pushes"))):
            bag = client.start(profile="identification", purpose="identification", split=split,
                               session_id=session_id, timeout_s=STARTUP_S)
            client.stop()
            names[(kind, split)] = Path(bag)
    finally:
        probe.close()
        assert recorder.stop() == 0, recorder.log()
    stamp = r"20\d{6}T\d{6}Z"
    assert re.fullmatch(rf"{stamp}-emulated_panda-identification-held_out", names[("", "held_out")].name)
    assert re.fullmatch(rf"{stamp}-emulated_panda-identification-fit", names[("", "fit")].name)
    assert re.fullmatch(rf"{stamp}-identification-joints-fit", names[("joints", "fit")].name)
    assert re.fullmatch(rf"{stamp}-identification-pushes-held_out", names[("pushes", "held_out")].name)
    for (_, split), bag in names.items():
        assert bag.parent == tmp_path / "bags" and bag.is_dir()
        with open_bag(bag) as opened:
            assert (opened.session.session_id, opened.session.split) == (bag.name, split)
