"""Bag writing, reading, splitting, repair and accounting without ROS (no rclpy).

Real bags written by others' tools come from ../shared/data/husky_imu_odom_gps/ (their
reference counts are in each metadata.yaml and in ../shared/data/README.md).
"""
from __future__ import annotations

import shutil
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from mcap.reader import make_reader
from rosbags.highlevel import AnyReader
from rosbags.typesys import Stores, get_typestore

from twinloop_logging.bag_reader import (BagCorruptError, BagNotFoundError, MissingTopicError,
                                         UnknownMessageTypeError, interpolate, nearest, open_bag)
from twinloop_logging.bag_writer import BagWriter
from twinloop_logging.drops import TopicAccount, header_stamp_ns
from twinloop_logging.profiles import ProfileError, parse_profiles, select_profile
from twinloop_logging.recording import RecordingOptions, SessionWriter
from twinloop_logging.repair import repair_bag
from twinloop_logging.session import BagExistsError, SessionError, new_session, session_name
from twinloop_logging.typedefs import TypeResolver, UnknownMessageType

ROOT = Path(__file__).resolve().parents[3]
HUSKY = ROOT.parent / "shared" / "data" / "husky_imu_odom_gps"
STORE = get_typestore(Stores.ROS2_KILTED)
JS = "sensor_msgs/msg/JointState"
T0 = 1_700_000_000_000_000_000
CLI = [str(Path(sys.executable).with_name("twinloop")), "bag"]  # `twinloop bag`, as a user runs it


def joint_state_cdr(i: int, stamp_ns: int | None = None) -> bytes:
    t = STORE.types
    stamp_ns = T0 + i * 1_000_000 if stamp_ns is None else stamp_ns
    msg = t[JS](header=t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](
        sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), frame_id=""),
        name=["j1", "j2"], position=np.array([float(i), -2.0 * i]), velocity=np.array([1.0, 2.0]),
        effort=np.array([0.5, 0.25]))
    return bytes(STORE.serialize_cdr(msg, JS))


def write_counter_bag(path: Path, count: int, **options) -> Path:
    writer = BagWriter(path, **options)
    writer.add_topic("/joint_states", TypeResolver().definition(JS))
    for i in range(count):
        writer.write("/joint_states", joint_state_cdr(i), T0 + i * 1_000_000)
    writer.close()
    return path


def positions(path: Path) -> list[float]:
    with open_bag(path) as bag:
        return [float(m.msg.position[0]) for m in bag.messages(["/joint_states"])]


# ---------------------------------------------------------------- real bags of others

@pytest.mark.parametrize("folder", ["husky_test1_rosbag2_mcap_zstd", "husky_test1_first60s_rosbag2_sqlite3"])
def test_real_rosbag2_counts_equal_their_metadata(folder):
    info = yaml.safe_load((HUSKY / folder / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    reference = {t["topic_metadata"]["name"]: t["message_count"] for t in info["topics_with_message_count"]}
    with open_bag(HUSKY / folder) as bag:
        assert {t.name: t.count for t in bag.topics.values()} == reference
        counted = {}
        for m in bag.messages():
            counted[m.topic] = counted.get(m.topic, 0) + 1
        assert counted == reference
        assert bag.message_count == info["message_count"]
        # Gravity on a real IMU: README reference ~9.79 m/s^2 (the robot drives, so the
        # mean norm carries a little motion).
        gravity = np.linalg.norm(bag.imu("/imu/data").linear_acceleration, axis=1)
        assert np.mean(gravity) == pytest.approx(9.8, abs=0.1)


def test_real_ros1_bag_reads_with_the_same_counts_as_its_conversion():
    with open_bag(HUSKY / "robot_localization_test1_ros1.bag") as ros1, \
            open_bag(HUSKY / "husky_test1_rosbag2_mcap_zstd") as ros2:
        assert ros1.format == "ros1"
        assert {t.name: t.count for t in ros1.topics.values()} == {t.name: t.count for t in ros2.topics.values()}
        a, b = ros1.imu("/imu/data"), ros2.imu("/imu/data")
        np.testing.assert_array_equal(a.stamps_ns, b.stamps_ns)
        np.testing.assert_allclose(a.linear_acceleration, b.linear_acceleration)


# ---------------------------------------------------------------- round trips

def test_written_bag_reads_with_rosbags_mcap_and_our_reader(tmp_path):
    path = write_counter_bag(tmp_path / "bag", 500)
    with AnyReader([path]) as reader:
        assert reader.message_count == 500
        connection = reader.connections[0]
        assert connection.msgtype == JS and connection.msgdef.data.startswith("std_msgs/Header header")
    files = sorted(path.glob("*.mcap"))
    with open(files[0], "rb") as stream:
        reader = make_reader(stream)
        summary = reader.get_summary()
        assert summary.statistics.message_count == 500
        schema = next(iter(summary.schemas.values()))
        assert (schema.name, schema.encoding) == (JS, "ros2msg")
        assert next(iter(summary.channels.values())).metadata["topic_type_hash"].startswith("RIHS01_")
    assert positions(path) == [float(i) for i in range(500)]
    with open_bag(path) as bag:
        series = bag.joint_states()
        assert series.names == ["j1", "j2"]
        np.testing.assert_array_equal(series.position[:, 1], -2.0 * np.arange(500))
        # Halfway between samples 10 and 11 (1 ms apart): linear interpolation.
        mid = series.at([T0 + 10_500_000])
        np.testing.assert_allclose(mid.position, [[10.5, -21.0]])


@pytest.mark.parametrize("options", [{"split_size_bytes": 20_000, "chunk_size": 4096},
                                     {"split_duration_s": 0.1, "compress": True}])
def test_split_loses_no_message(tmp_path, options):
    path = write_counter_bag(tmp_path / "bag", 1000, **options)
    files = sorted(path.glob("*.mcap"))
    assert len(files) >= 5, files
    meta = yaml.safe_load((path / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert [f["path"] for f in meta["files"]] == meta["relative_file_paths"] and len(meta["files"]) == len(files)
    assert sum(f["message_count"] for f in meta["files"]) == 1000
    assert positions(path) == [float(i) for i in range(1000)]
    if "split_size_bytes" in options:  # a file may exceed the limit by at most one chunk
        assert all(f.stat().st_size < 20_000 + 4096 + 8192 for f in files)
    if options.get("compress"):
        with open(files[0], "rb") as stream:
            chunk_index = make_reader(stream).get_summary().chunk_indexes[0]
            assert chunk_index.compression == "zstd"


def test_session_metadata_and_drops_are_stored(tmp_path):
    session = new_session("trial", "held_out", robot="panda", twin_version="emulated/v3", policy_version="push/v1",
                          operator_note="box at the left")
    recording = SessionWriter(tmp_path / "bag", session, RecordingOptions(flush_interval_s=0.05))
    recording.add_topic("/joint_states", TypeResolver().definition(JS), [])
    for i in range(200):
        if i in (50, 51, 120):  # never delivered: the publisher's sequence numbers skip them
            continue
        recording.put("/joint_states", joint_state_cdr(i), T0 + i * 10_000_000, publisher=b"pub", sequence=i + 1)
    recording.annotate("first push")
    snapshot = recording.stop()
    (counts,) = snapshot.topics
    assert (counts.received, counts.expected, counts.dropped_estimate) == (197, 200, 3)
    with open_bag(tmp_path / "bag") as bag:
        stored = bag.session
        assert (stored.purpose, stored.split, stored.twin_version, stored.policy_version) == (
            "trial", "held_out", "emulated/v3", "push/v1")
        assert stored.operator_note == "box at the left" and stored.host and stored.robot == "panda"
        assert [a.note for a in stored.annotations] == ["first push"]
        assert bag.topic_stats["/joint_states"]["dropped_estimate"] == 3
        assert bag.topics["/joint_states"].count == 197


# ---------------------------------------------------------------- accounting

def test_drop_accounting_by_sequence_and_by_stamp():
    by_sequence = TopicAccount("/a", JS, has_header=True)
    for seq in [1, 2, 3, 7, 8, 10]:  # 4, 5, 6, 9 lost
        by_sequence.on_message(joint_state_cdr(seq), b"p", seq)
    by_sequence.written = 6
    assert (by_sequence.counts().expected, by_sequence.counts().dropped_estimate) == (10, 4)
    # A gap while the subscription is being matched (first 100 ms) is not a drop; later ones are.
    settling = TopicAccount("/c", JS, has_header=False)
    for seq, receive_ms in [(5, 0), (8, 20), (9, 200), (11, 210)]:
        settling.on_message(b"", b"p", seq, T0 + receive_ms * 1_000_000)
    settling.written = 4
    assert (settling.counts().startup_gaps, settling.counts().dropped_estimate) == (2, 1)

    by_stamp = TopicAccount("/b", JS, has_header=True)  # no sequence numbers: 2 ms stamps
    kept = [i for i in range(100) if i not in (30, 31, 32, 70)]
    for i in kept:
        by_stamp.on_message(joint_state_cdr(i, T0 + i * 2_000_000), None, None)
    by_stamp.written = len(kept)
    assert by_stamp.counts().stamp_gaps == 4 and by_stamp.counts().dropped_estimate == 4
    assert header_stamp_ns(joint_state_cdr(3, T0 + 123)) == T0 + 123
    by_stamp.on_lost(2)
    assert by_stamp.counts().lost_reported == 2 and by_stamp.counts().dropped_estimate == 4


def test_time_alignment_helpers():
    stamps = np.array([0, 10, 20, 100], dtype=np.int64) * 1_000_000
    values = np.array([0.0, 1.0, 2.0, 10.0])
    out = interpolate(stamps, values, np.array([5, 15, 50, 200]) * 1_000_000, max_gap_s=0.05)
    np.testing.assert_allclose(out[:2], [0.5, 1.5])
    assert np.isnan(out[2]) and np.isnan(out[3])  # inside an 80 ms gap; after the end
    np.testing.assert_array_equal(nearest(stamps, np.array([9, 60, 99]) * 1_000_000, tolerance_s=0.002), [1, -1, 3])


# ---------------------------------------------------------------- bad input, nothing lost

def test_existing_bag_is_never_overwritten(tmp_path):
    path = write_counter_bag(tmp_path / "bag", 10)
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    with pytest.raises(BagExistsError, match="never overwrites"):
        BagWriter(path)
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before


def test_truncated_bag_is_a_clear_error_and_repair_keeps_every_complete_chunk(tmp_path):
    path = tmp_path / "bag"
    writer = BagWriter(path, chunk_size=1 << 30)
    writer.add_topic("/joint_states", TypeResolver().definition(JS))
    for i in range(300):
        writer.write("/joint_states", joint_state_cdr(i), T0 + i * 1_000_000)
        if i % 100 == 99:
            writer.flush()  # chunks of exactly 100 messages
    writer.close()
    mcap_file = next(path.glob("*.mcap"))
    data = mcap_file.read_bytes()
    # Cut inside the third chunk, as a SIGKILL during its write would.
    with open(mcap_file, "rb") as stream:
        third = make_reader(stream).get_summary().chunk_indexes[2]
    mcap_file.write_bytes(data[:third.chunk_start_offset + third.chunk_length // 2])
    with pytest.raises(BagCorruptError, match="twinloop bag repair"):
        open_bag(path)
    report = repair_bag(path)
    assert report.files[0].status == "recovered" and report.topics == {"/joint_states": 200}
    assert positions(path) == [float(i) for i in range(200)]
    # The damaged original is kept, byte for byte.
    assert (path / (mcap_file.name + ".damaged")).read_bytes() == data[:third.chunk_start_offset + third.chunk_length // 2]


def test_corrupt_chunk_costs_only_its_own_messages(tmp_path):
    path = tmp_path / "bag"
    writer = BagWriter(path, chunk_size=1 << 30)
    writer.add_topic("/joint_states", TypeResolver().definition(JS))
    for i in range(300):
        writer.write("/joint_states", joint_state_cdr(i), T0 + i * 1_000_000)
        if i % 100 == 99:
            writer.flush()
    writer.close()
    mcap_file = next(path.glob("*.mcap"))
    with open(mcap_file, "rb") as stream:
        second = make_reader(stream).get_summary().chunk_indexes[1]
    data = bytearray(mcap_file.read_bytes())
    data[second.chunk_start_offset + second.chunk_length - 100] ^= 0xFF  # a flipped byte in chunk 2's records
    del data[-40:]  # and no footer
    mcap_file.write_bytes(bytes(data))
    report = repair_bag(path)
    # chunk 3, after the damaged one, is kept: only chunk 2's 100 messages are lost (counted
    # from the message index written after it)
    assert report.topics == {"/joint_states": 200}, report.text()
    assert "CRC mismatch, 100 messages" in report.files[0].note and "100 messages lost" in report.files[0].note
    assert positions(path) == [float(i) for i in list(range(100)) + list(range(200, 300))]


def test_missing_topic_and_missing_bag_are_clear_errors(tmp_path):
    path = write_counter_bag(tmp_path / "bag", 5)
    with open_bag(path) as bag:
        with pytest.raises(MissingTopicError, match=r"'/wrench' is not in bag .*'/joint_states'"):
            bag.wrenches("/wrench")
    with pytest.raises(BagNotFoundError):
        open_bag(tmp_path / "nope")
    shutil.rmtree(path / "metadata.yaml", ignore_errors=True)
    (path / "metadata.yaml").unlink()
    with pytest.raises(BagCorruptError, match="twinloop bag repair"):
        open_bag(path)


def test_unknown_message_type(tmp_path):
    with pytest.raises(UnknownMessageType, match="vendor_msgs/msg/Thing.*Install or source"):
        TypeResolver().definition("vendor_msgs/msg/Thing")
    # A real sqlite3 bag (no definitions stored for one topic) whose type no typestore knows:
    copy = tmp_path / "husky"
    shutil.copytree(HUSKY / "husky_test1_first60s_rosbag2_sqlite3", copy)
    for p in copy.iterdir():
        p.chmod(0o644)
    db = sqlite3.connect(next(copy.glob("*.db3")))
    db.execute("update topics set type='vendor_msgs/msg/Imu' where name='/imu/data'")
    db.execute("delete from message_definitions where topic_type='sensor_msgs/msg/Imu'")
    db.commit()
    db.close()
    meta = copy / "metadata.yaml"
    meta.write_text(meta.read_text().replace("type: sensor_msgs/msg/Imu", "type: vendor_msgs/msg/Imu"))
    with open_bag(copy) as bag:
        assert sum(1 for _ in bag.messages(["/fix"])) == 150  # the other topics still read
        with pytest.raises(UnknownMessageTypeError, match="vendor_msgs/msg/Imu.*raw=True"):
            next(bag.messages(["/imu/data"]))
        raw = next(bag.messages(["/imu/data"], raw=True)).msg
        assert isinstance(raw, bytes) and struct.unpack_from("<i", raw, 4)[0] > 1e9  # header stamp sec


def test_profiles_and_sessions_refuse_bad_input():
    profiles = parse_profiles({"profiles": {"cal": {"topics": ["/joint_states"], "regex": ["/cam/.*"],
                                                    "exclude": ["/cam/secret"]}}})
    cal = select_profile(profiles, "cal")
    assert cal.matches("/joint_states") and cal.matches("/cam/image") and not cal.matches("/cam/secret")
    assert not cal.matches("/tf") and cal.missing(["/cam/image"]) == ["/joint_states"]
    with pytest.raises(ProfileError, match="unknown recording profile 'x'.*'cal'"):
        select_profile(profiles, "x")
    with pytest.raises(ProfileError, match="invalid regular expression"):
        parse_profiles({"profiles": {"bad": {"regex": ["(("]}}})
    with pytest.raises(ProfileError, match="unknown keys"):
        parse_profiles({"profiles": {"bad": {"topic": ["/a"]}}})
    with pytest.raises(SessionError, match="split 'test'"):
        new_session("trial", "test")
    with pytest.raises(SessionError, match="purpose 'play'"):
        new_session("play", "fit")
    with pytest.raises(SessionError, match="folder-safe"):
        new_session("trial", "fit", session_id="../escape")


def test_session_names_carry_purpose_kind_and_split():
    at = 1_796_318_692_000_000_000  # 2026-12-03 17:24:52 UTC
    assert session_name("identification", "fit", robot="emulated panda", kind="joints", now_ns=at) == (
        "20261203T172452Z-emulated_panda-identification-joints-fit")
    assert session_name("identification", "held_out", kind="pushes", now_ns=at) == (
        "20261203T172452Z-identification-pushes-held_out")
    generated = new_session("calibration", "held_out", robot="panda").session_id
    assert generated.endswith("-panda-calibration-held_out") and len(generated) == len("20261203T172452Z") + 27
    assert new_session("trial", "fit", session_id="given").session_id == "given"


def test_bag_folder_is_absolute_whatever_output_dir_says(tmp_path, monkeypatch):
    from twinloop_logging.session import bag_path_for
    monkeypatch.chdir(tmp_path)
    path = bag_path_for("bags", new_session("trial", "held_out", session_id="t0"), unique=False)
    assert path == tmp_path / "bags" / "t0" and path.is_absolute()


# ---------------------------------------------------------------- command line

def test_cli_info_and_repair(tmp_path):
    out = subprocess.run([*CLI, "info", str(HUSKY / "husky_test1_rosbag2_mcap_zstd")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "/imu/data" in out.stdout and "11865" in out.stdout and "16806" in out.stdout
    missing = subprocess.run([*CLI, "info", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no bag at" in missing.stderr
    path = write_counter_bag(tmp_path / "bag", 50)
    (path / "metadata.yaml").unlink()
    repaired = subprocess.run([*CLI, "repair", str(path)], capture_output=True, text=True, timeout=60)
    assert repaired.returncode == 0 and "intact, 50 messages" in repaired.stdout, repaired.stdout + repaired.stderr
    assert positions(path) == [float(i) for i in range(50)]
