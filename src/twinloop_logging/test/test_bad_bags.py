"""Damaged and foreign bags: found by `twinloop bag info`, recovered chunk by chunk by
`twinloop bag repair`, refused when the folder is not one bag, and nothing changed on a
refusal or on a bag that is intact. No rclpy."""
from __future__ import annotations

import hashlib
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from mcap.reader import make_reader
from rosbags.typesys import Stores, get_typestore

from twinloop_logging import cli
from twinloop_logging.bag_reader import BagCorruptError, open_bag
from twinloop_logging.bag_writer import BagOptionError, BagWriter
from twinloop_logging.integrity import check_bag
from twinloop_logging.repair import RepairError, repair_bag
from twinloop_logging.session import SESSION_KEY, new_session
from twinloop_logging.typedefs import TypeResolver

STORE = get_typestore(Stores.ROS2_KILTED)
JS = "sensor_msgs/msg/JointState"
T0 = 1_700_000_000_000_000_000
PER_CHUNK = 50
CHUNKS = 8


def joint_state(i: int) -> bytes:
    t = STORE.types
    stamp = T0 + i * 1_000_000
    msg = t[JS](header=t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](
        sec=stamp // 10**9, nanosec=stamp % 10**9), frame_id=""),
        name=["j1"], position=np.array([float(i)]), velocity=np.zeros(1), effort=np.zeros(1))
    return bytes(STORE.serialize_cdr(msg, JS))


def write_bag(path: Path, *, session_id: str = "s1", chunks: int = CHUNKS, compress: bool = False) -> Path:
    """A bag of `chunks` chunks of exactly PER_CHUNK messages, with a session."""
    session = new_session("identification", "fit", session_id=session_id, robot="panda")
    writer = BagWriter(path, chunk_size=1 << 30, compress=compress,
                       file_metadata={SESSION_KEY: {"json": session.to_json()}})
    writer.custom_data[SESSION_KEY] = session.to_json()
    writer.add_topic("/joint_states", TypeResolver().definition(JS))
    for i in range(chunks * PER_CHUNK):
        writer.write("/joint_states", joint_state(i), T0 + i * 1_000_000)
        if i % PER_CHUNK == PER_CHUNK - 1:
            writer.flush()
    writer.close()
    return path


def overwrite_chunk(path: Path, index: int, *, at: float = 0.5) -> None:
    """Overwrite 64 bytes inside chunk `index` of the bag's file (its framing stays intact)."""
    mcap = next(path.glob("*.mcap"))
    with open(mcap, "rb") as stream:
        chunk = make_reader(stream).get_summary().chunk_indexes[index]
    data = bytearray(mcap.read_bytes())
    start = chunk.chunk_start_offset + int(chunk.chunk_length * at)
    data[start:start + 64] = b"\xaa" * 64
    mcap.write_bytes(bytes(data))


def hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def positions(path: Path) -> list[float]:
    with open_bag(path) as bag:
        return [float(m.msg.position[0]) for m in bag.messages(["/joint_states"])]


@pytest.mark.parametrize("compress", [False, True])
def test_overwritten_chunk_is_found_and_only_its_messages_are_lost(tmp_path, compress, capsys):
    path = write_bag(tmp_path / "bag", compress=compress)
    overwrite_chunk(path, 2)
    # The summary is intact, so the bag opens; reading reaches the chunk and says what to do.
    with open_bag(path) as bag:
        with pytest.raises(BagCorruptError, match="twinloop bag repair"):
            list(bag.messages())
    check = check_bag(path)
    assert check.topics == {"/joint_states": (CHUNKS - 1) * PER_CHUNK}
    assert f"CRC mismatch, {PER_CHUNK} messages" in check.problems[0] or \
        f"{PER_CHUNK} messages" in check.problems[0], check.problems
    assert any("says 400 messages, the files hold 350" in p for p in check.problems), check.problems

    before = hashes(path)
    assert cli.main(["info", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "problem:" in out and "twinloop bag repair" in err and "Traceback" not in err
    assert hashes(path) == before  # info changes nothing

    damaged = next(path.glob("*.mcap")).read_bytes()
    report = repair_bag(path)
    assert report.topics == {"/joint_states": (CHUNKS - 1) * PER_CHUNK}, report.text()
    assert f"{PER_CHUNK} messages lost" in report.files[0].note
    expected = [float(i) for i in range(CHUNKS * PER_CHUNK) if not 2 * PER_CHUNK <= i < 3 * PER_CHUNK]
    assert positions(path) == expected
    assert (path / (next(path.glob("*.mcap")).name + ".damaged")).read_bytes() == damaged
    assert check_bag(path).problems == []
    assert cli.main(["info", str(path)]) == 0
    with open_bag(path) as bag:
        assert bag.session.session_id == "s1"

    repaired = hashes(path)
    again = repair_bag(path)
    assert again.changed == [] and hashes(path) == repaired  # whole now: a second repair changes nothing


def test_unreadable_bytes_between_chunks_resume_at_the_next_indexed_chunk(tmp_path):
    path = write_bag(tmp_path / "bag")
    mcap = next(path.glob("*.mcap"))
    with open(mcap, "rb") as stream:
        chunk = make_reader(stream).get_summary().chunk_indexes[4]
    data = bytearray(mcap.read_bytes())
    data[chunk.chunk_start_offset:chunk.chunk_start_offset + 9] = b"\xff" * 9  # opcode and length of chunk 5
    mcap.write_bytes(bytes(data))
    report = repair_bag(path)
    assert report.topics == {"/joint_states": (CHUNKS - 1) * PER_CHUNK}, report.text()
    assert positions(path)[4 * PER_CHUNK] == 5 * PER_CHUNK


def test_truncated_bag_keeps_every_complete_chunk(tmp_path):
    path = write_bag(tmp_path / "bag")
    mcap = next(path.glob("*.mcap"))
    with open(mcap, "rb") as stream:
        chunk = make_reader(stream).get_summary().chunk_indexes[5]
    mcap.write_bytes(mcap.read_bytes()[:chunk.chunk_start_offset + chunk.chunk_length // 3])
    report = repair_bag(path)
    assert report.topics == {"/joint_states": 5 * PER_CHUNK} and "ends inside a record" in report.files[0].note
    assert positions(path) == [float(i) for i in range(5 * PER_CHUNK)]


def test_repairing_again_never_overwrites_what_an_earlier_repair_kept(tmp_path):
    path = write_bag(tmp_path / "bag")
    original = (path / "metadata.yaml").read_text()
    meta = yaml.safe_load(original)
    meta["rosbag2_bagfile_information"]["message_count"] = 99999
    (path / "metadata.yaml").write_text(yaml.safe_dump(meta))
    first = repair_bag(path)
    assert "kept the previous metadata.yaml as metadata.yaml.before_repair" in first.changed
    overwrite_chunk(path, 1)
    second = repair_bag(path)
    assert "kept the previous metadata.yaml as metadata.yaml.before_repair.1" in second.changed
    assert yaml.safe_load((path / "metadata.yaml.before_repair").read_text()) == meta
    assert (path / "metadata.yaml.before_repair.1").exists()
    damaged = (path / "bag_0.mcap.damaged").read_bytes()
    overwrite_chunk(path, 0)  # the repaired file, damaged again
    third = repair_bag(path)
    assert "kept the original as bag_0.mcap.damaged.1" in third.changed, third.changed
    assert (path / "bag_0.mcap.damaged").read_bytes() == damaged
    assert yaml.safe_load((path / "metadata.yaml.before_repair").read_text()) == meta


def test_repair_refuses_what_is_not_one_bag_and_changes_nothing(tmp_path):
    # a file (even an MCAP file inside a folder of others)
    loose = tmp_path / "loose"
    loose.mkdir()
    write_bag(tmp_path / "a", session_id="a")
    write_bag(tmp_path / "b", session_id="b")
    shutil.copy(next((tmp_path / "a").glob("*.mcap")), loose / "first.mcap")
    shutil.copy(next((tmp_path / "b").glob("*.mcap")), loose / "second.mcap")
    (loose / "notes.mcap").write_text("not an mcap file")
    before = hashes(loose)
    for target in (loose / "notes.mcap", loose / "first.mcap", loose):
        with pytest.raises(RepairError) as error:
            repair_bag(target)
        assert "\n" not in str(error.value)
        assert hashes(loose) == before, target
    # split-file names of one bag but two sessions
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(next((tmp_path / "a").glob("*.mcap")), mixed / "mixed_0.mcap")
    shutil.copy(next((tmp_path / "b").glob("*.mcap")), mixed / "mixed_1.mcap")
    before = hashes(mixed)
    with pytest.raises(RepairError, match="different recording sessions"):
        repair_bag(mixed)
    assert hashes(mixed) == before
    # a non-MCAP file among a bag's files
    bag = write_bag(tmp_path / "c")
    (bag / "c_1.mcap").write_bytes(b"\x00" * 100)
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())
    meta["rosbag2_bagfile_information"]["relative_file_paths"].append("c_1.mcap")
    (bag / "metadata.yaml").write_text(yaml.safe_dump(meta))
    before = hashes(bag)
    with pytest.raises(RepairError, match="c_1.mcap .*not MCAP"):
        repair_bag(bag)
    assert hashes(bag) == before


def test_files_not_in_metadata_are_left_alone(tmp_path):
    bag = write_bag(tmp_path / "bag")
    (bag / "metadata.yaml").unlink()
    repair_bag(bag)  # rebuilds metadata.yaml listing bag_0.mcap
    stranger = write_bag(tmp_path / "other", session_id="other")
    shutil.copy(next(stranger.glob("*.mcap")), bag / "other.mcap")
    report = repair_bag(bag)
    assert [(f.path, f.status) for f in report.files] == [("bag_0.mcap", "intact"), ("other.mcap", "ignored")]
    assert report.changed == [] and report.topics == {"/joint_states": CHUNKS * PER_CHUNK}


def test_bare_mcap_file_reads_like_ros2_bag_info(tmp_path, capsys):
    bag = write_bag(tmp_path / "bag")
    bare = tmp_path / "session.mcap"
    shutil.copy(next(bag.glob("*.mcap")), bare)
    with open_bag(bare) as opened:
        assert opened.format == "mcap" and opened.topics["/joint_states"].count == CHUNKS * PER_CHUNK
        assert opened.session.session_id == "s1"  # from the file's own metadata record
    assert cli.main(["info", str(bare)]) == 0
    assert "s1: purpose identification" in capsys.readouterr().out


def test_metadata_count_beside_a_different_file_count_is_flagged(tmp_path, capsys):
    bag = write_bag(tmp_path / "bag")
    meta = yaml.safe_load((bag / "metadata.yaml").read_text())
    meta["rosbag2_bagfile_information"]["message_count"] = 99999
    (bag / "metadata.yaml").write_text(yaml.safe_dump(meta))
    assert cli.main(["info", str(bag)]) == 2
    out, err = capsys.readouterr()
    assert "metadata.yaml says 99999 messages, the files hold 400" in out and "twinloop bag repair" in err


@pytest.mark.parametrize("options", [{"split_duration_s": math.nan}, {"split_duration_s": -1.0},
                                     {"split_size_bytes": -5}, {"split_size_bytes": 1.5}, {"chunk_size": 0}])
def test_writer_options_out_of_range_create_nothing(tmp_path, options):
    with pytest.raises(BagOptionError, match=next(iter(options))):
        BagWriter(tmp_path / "out" / "bag", **options)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", [["--split-duration", "nan"], ["--split-size", "-5"], ["--duration", "inf"]])
def test_record_refuses_bad_options_before_starting_anything(tmp_path, option):
    out = subprocess.run([str(Path(sys.executable).with_name("twinloop")), "bag", "record", "calibration",
                          "--output-dir", str(tmp_path / "bags"), *option],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and option[0] in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bags").exists()
