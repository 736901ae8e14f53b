"""Repair a bag the recorder could not finalize (SIGKILL, power loss, storage full).

Like `ros2 bag reindex` plus `mcap recover`: every MCAP file without a valid summary is
read record by record (the `mcap` library's StreamReader, CRCs checked) up to the last
complete chunk, and rewritten with a summary; the damaged original is kept beside it
as `<file>.damaged`. Then `metadata.yaml` is rebuilt from the files, with the session
metadata the recorder stored inside them. Nothing is deleted.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from mcap.exceptions import McapError
from mcap.reader import make_reader
from mcap.records import Channel, Message, Metadata, Schema
from mcap.stream_reader import StreamReader
from mcap.writer import CompressionType, Writer
from rosbags.rosbag2.metadata import parse_qos

from twinloop_logging.bag_writer import LIBRARY, FileStats, TopicEntry, metadata_dict, write_metadata
from twinloop_logging.session import ANNOTATION_KEY, SESSION_KEY, Annotation, SessionInfo

MAGIC = b"\x89MCAP0\r\n"


class RepairError(RuntimeError):
    """The folder holds nothing that can be repaired; the message says why."""


@dataclass
class FileReport:
    path: str
    status: str          # intact | recovered | unreadable
    messages: int
    note: str = ""


@dataclass
class RepairReport:
    bag: Path
    files: list[FileReport] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)
    session: SessionInfo | None = None

    def text(self) -> str:
        lines = [f"bag {self.bag}"]
        for f in self.files:
            lines.append(f"  {f.path}: {f.status}, {f.messages} messages{'; ' + f.note if f.note else ''}")
        lines += [f"  {topic}: {count}" for topic, count in sorted(self.topics.items())]
        return "\n".join(lines)


def _index(path: Path) -> tuple[int, str]:
    match = re.search(r"_(\d+)\.mcap$", path.name)
    return (int(match.group(1)) if match else 0, path.name)


class _Collector:
    """Topics, per-file stats and session records gathered over all files of the bag."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicEntry] = {}
        self.sessions: list[SessionInfo] = []
        self.annotations: list[Annotation] = []

    def channel(self, channel: Channel, schema: Schema | None) -> None:
        if channel.topic not in self.topics:
            qos_text = channel.metadata.get("offered_qos_profiles", "")
            try:
                qos = parse_qos(qos_text) if qos_text else []
            except Exception:  # QoS is informative; a bad entry must not stop a repair
                qos = []
            self.topics[channel.topic] = TopicEntry(channel.topic, schema.name if schema else "",
                                                    channel.metadata.get("topic_type_hash", ""), qos)

    def metadata(self, record: Metadata) -> None:
        if record.name == SESSION_KEY and "json" in record.metadata:
            self.sessions.append(SessionInfo.from_json(record.metadata["json"]))
        elif record.name == ANNOTATION_KEY:
            self.annotations.append(Annotation(int(record.metadata.get("time_ns", 0)), record.metadata.get("note", "")))


def _intact(path: Path, stats: FileStats, collector: _Collector) -> bool:
    with open(path, "rb") as stream:
        stream.seek(0, 2)
        if stream.tell() < 2 * len(MAGIC):
            return False
        stream.seek(-len(MAGIC), 2)
        if stream.read() != MAGIC:
            return False
        stream.seek(0)
        try:
            reader = make_reader(stream)
            summary = reader.get_summary()
            if summary is None or summary.statistics is None:
                return False
            for channel in summary.channels.values():
                collector.channel(channel, summary.schemas.get(channel.schema_id))
                topic = collector.topics[channel.topic]
                topic.message_count += summary.statistics.channel_message_counts.get(channel.id, 0)
            stats.message_count = summary.statistics.message_count
            stats.start_ns, stats.end_ns = summary.statistics.message_start_time, summary.statistics.message_end_time
            for record in reader.iter_metadata():
                collector.metadata(record)
        except (McapError, ValueError, KeyError):
            return False
    return True


def _recover(path: Path, stats: FileStats, collector: _Collector) -> str:
    """Rewrite `path` from its readable records; returns why reading stopped."""
    tmp = path.with_name(path.name + ".recovering")
    schemas: dict[int, Schema] = {}
    channels: dict[int, Channel] = {}
    out_channels: dict[int, int] = {}
    out_schemas: dict[int, int] = {}
    note = "file complete"
    # "wb": a .recovering file is only ever a leftover of an interrupted repair.
    with open(path, "rb") as source, open(tmp, "wb") as target:
        writer = Writer(target, compression=CompressionType.ZSTD)
        writer.start(profile="ros2", library=LIBRARY + " (repaired)")
        try:
            for record in StreamReader(source, validate_crcs=True).records:
                if isinstance(record, Schema):
                    schemas[record.id] = record
                elif isinstance(record, Channel):
                    channels[record.id] = record
                elif isinstance(record, Metadata):
                    if record.name != "rosbag2":
                        writer.add_metadata(record.name, record.metadata)
                        collector.metadata(record)
                elif isinstance(record, Message):
                    channel = channels.get(record.channel_id)
                    if channel is None:
                        continue
                    if record.channel_id not in out_channels:
                        schema = schemas.get(channel.schema_id)
                        if schema is not None and schema.id not in out_schemas:
                            out_schemas[schema.id] = writer.register_schema(schema.name, schema.encoding, schema.data)
                        out_channels[record.channel_id] = writer.register_channel(
                            channel.topic, channel.message_encoding, out_schemas.get(channel.schema_id, 0),
                            channel.metadata)
                        collector.channel(channel, schema)
                    writer.add_message(out_channels[record.channel_id], record.log_time, record.data,
                                       record.publish_time, record.sequence)
                    collector.topics[channel.topic].message_count += 1
                    stats.add(record.log_time)
        except (McapError, EOFError, ValueError, struct.error) as error:  # the file ends mid-record
            note = f"read stopped at byte {source.tell()} of {path.stat().st_size}: {type(error).__name__} {error}".strip()
        writer.finish()
    path.rename(path.with_name(path.name + ".damaged"))
    tmp.rename(path)
    return note


def repair_bag(bag: Path | str) -> RepairReport:
    """Make a bag folder readable again and rebuild its metadata.yaml (see module doc)."""
    bag = Path(bag)
    if bag.is_file():
        bag = bag.parent
    if not bag.is_dir():
        raise RepairError(f"{bag} is not a bag folder (nor a file inside one)")
    files = sorted((p for p in bag.glob("*.mcap")), key=_index)
    if not files:
        raise RepairError(f"{bag} holds no .mcap file; only MCAP bags can be repaired here "
                          "(a sqlite3 bag is repaired by sqlite3's own recovery)")
    collector = _Collector()
    report = RepairReport(bag)
    all_stats = []
    for path in files:
        stats = FileStats(path.name)
        if _intact(path, stats, collector):
            report.files.append(FileReport(path.name, "intact", stats.message_count))
        else:
            try:
                note = _recover(path, stats, collector)
                report.files.append(FileReport(path.name, "recovered", stats.message_count, note))
            except (McapError, OSError, ValueError, struct.error) as error:
                report.files.append(FileReport(path.name, "unreadable", 0, f"{type(error).__name__}: {error}"))
                continue
        all_stats.append(stats)

    old = bag / "metadata.yaml"
    custom: dict[str, str] = {}
    if old.exists():
        try:
            custom = dict(yaml.safe_load(old.read_text())["rosbag2_bagfile_information"].get("custom_data") or {})
        except (yaml.YAMLError, KeyError, TypeError):
            custom = {}
        old.replace(bag / "metadata.yaml.before_repair")
    if collector.sessions and "twinloop.session" not in custom:
        session = collector.sessions[0]
        session.annotations = sorted(collector.annotations, key=lambda a: a.time_ns)
        custom[SESSION_KEY] = session.to_json()
    if any(f.status != "intact" for f in report.files):
        custom["twinloop.repaired"] = json.dumps([f.__dict__ for f in report.files])
    if SESSION_KEY in custom:
        report.session = SessionInfo.from_json(custom[SESSION_KEY])
    write_metadata(bag, metadata_dict(all_stats, list(collector.topics.values()), custom))
    report.topics = {t.name: t.message_count for t in collector.topics.values()}
    return report
