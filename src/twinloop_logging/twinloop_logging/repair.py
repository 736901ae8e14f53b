"""Repair a bag the recorder could not finalize (SIGKILL, power loss, storage full) or
whose files were damaged later.

Like `ros2 bag reindex` plus `mcap recover`: every MCAP file of the bag is read chunk by
chunk (integrity.scan_mcap: CRCs checked, a damaged chunk skipped, reading resumed at the
next one). A file with damage, or without a summary, is rewritten from its readable
records, the original kept beside it as `<file>.damaged`; then `metadata.yaml` is rebuilt
from the files, with the session metadata the recorder stored inside them, the previous
one kept as `metadata.yaml.before_repair`. Nothing is deleted or overwritten, nothing is
written outside the bag folder, and a bag that is already whole is left untouched.

The folder must hold one bag: the files metadata.yaml lists, or files named
`<name>_<i>.mcap` after one name, all of one recording session. Anything else is refused
before any file is touched.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from mcap.records import Channel, Message, Metadata, Schema
from mcap.writer import CompressionType, Writer
from rosbags.rosbag2.metadata import parse_qos

from twinloop_logging.bag_writer import LIBRARY, FileStats, TopicEntry, metadata_dict, write_metadata
from twinloop_logging.integrity import MAGIC, FileScan, NotMcapError, compare_counts, read_metadata, scan_mcap
from twinloop_logging.session import ANNOTATION_KEY, SESSION_KEY, Annotation, SessionInfo

REPAIRED_KEY = "twinloop.repaired"
_SPLIT_NAME = re.compile(r"(.+)_(\d+)\.mcap")


class RepairError(RuntimeError):
    """The folder holds nothing that can be repaired, or not one bag; the message says why.
    Raised before anything is changed."""


@dataclass
class FileReport:
    path: str
    status: str          # intact | recovered | empty
    messages: int
    note: str = ""


@dataclass
class RepairReport:
    bag: Path
    files: list[FileReport] = field(default_factory=list)
    topics: dict[str, int] = field(default_factory=dict)
    session: SessionInfo | None = None
    changed: list[str] = field(default_factory=list)  # what the repair wrote or renamed, in order

    def text(self) -> str:
        lines = [f"bag {self.bag}"]
        for f in self.files:
            lines.append(f"  {f.path}: {f.status}, {f.messages} messages{'; ' + f.note if f.note else ''}")
        lines += [f"  {topic}: {count}" for topic, count in sorted(self.topics.items())]
        lines += [f"  {what}" for what in self.changed] or ["  nothing to repair: the bag is intact, nothing changed"]
        return "\n".join(lines)


def _index(path: Path) -> tuple[int, str]:
    match = _SPLIT_NAME.fullmatch(path.name)
    return (int(match.group(2)) if match else 0, path.name)


def free_name(path: Path) -> Path:
    """`path` if nothing is there, else `path.1`, `path.2`, ...: what is set aside is never overwritten."""
    candidate, n = path, 0
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate


class _Collector:
    """Topics, schemas and session records gathered over all files of the bag."""

    def __init__(self) -> None:
        self.topics: dict[str, TopicEntry] = {}
        self.schemas: dict[tuple[str, int], Schema] = {}
        self.sessions: dict[str, SessionInfo] = {}   # file name -> session its records name
        self.annotations: list[Annotation] = []

    def reader(self, file: str):
        def on_record(record) -> None:
            if isinstance(record, Schema):
                self.schemas[(file, record.id)] = record
            elif isinstance(record, Channel):
                self.channel(record, self.schemas.get((file, record.schema_id)))
            elif isinstance(record, Metadata):
                self.metadata(file, record)
        return on_record

    def channel(self, channel: Channel, schema: Schema | None) -> None:
        if channel.topic not in self.topics:
            qos_text = channel.metadata.get("offered_qos_profiles", "")
            try:
                qos = parse_qos(qos_text) if qos_text else []
            except Exception:  # QoS is informative; a bad entry must not stop a repair
                qos = []
            self.topics[channel.topic] = TopicEntry(channel.topic, schema.name if schema else "",
                                                    channel.metadata.get("topic_type_hash", ""), qos)

    def metadata(self, file: str, record: Metadata) -> None:
        try:
            if record.name == SESSION_KEY and "json" in record.metadata:
                self.sessions.setdefault(file, SessionInfo.from_json(record.metadata["json"]))
            elif record.name == ANNOTATION_KEY:
                self.annotations.append(Annotation(int(record.metadata.get("time_ns", 0)),
                                                   record.metadata.get("note", "")))
        except (ValueError, TypeError, KeyError):  # a garbled session record: the bag is still repaired
            pass


def bag_files(bag: Path, metadata: dict | None) -> tuple[list[Path], list[str], list[str]]:
    """The MCAP files of the bag in `bag`, the names of other MCAP files there (left alone)
    and of listed files that are missing. Raises RepairError when the folder does not hold
    one bag."""
    present = sorted(bag.glob("*.mcap"), key=_index)
    listed = [bag / name for name in (metadata or {}).get("relative_file_paths") or []
              if isinstance(name, str) and "/" not in name]
    if listed:
        stems = {m.group(1) for p in listed if (m := _SPLIT_NAME.fullmatch(p.name))}
        # and split files the recorder opened after it last wrote metadata.yaml
        later = [p for p in present if p not in listed and (m := _SPLIT_NAME.fullmatch(p.name)) and m.group(1) in stems]
        files = sorted([p for p in listed if p.exists()] + later, key=_index)
        return (files, [p.name for p in present if p not in files],
                [p.name for p in listed if not p.exists()])
    names = {m.group(1) if (m := _SPLIT_NAME.fullmatch(p.name)) else p.name for p in present}
    if len(names) > 1:
        raise RepairError(f"{bag} does not hold one bag: its MCAP files {[p.name for p in present]} are not the "
                          "split files of one recording (<name>_<i>.mcap) and there is no metadata.yaml listing "
                          "them. Move each recording into a folder of its own and repair that folder")
    return present, [], []


def repair_bag(bag: Path | str) -> RepairReport:
    """Make a bag folder readable again and rebuild its metadata.yaml (see module doc)."""
    bag = Path(bag)
    if not bag.exists():
        raise RepairError(f"no bag at {bag}")
    if not bag.is_dir():
        raise RepairError(f"{bag} is a file; repair works on a bag folder (the one the recorder wrote, with "
                          f"metadata.yaml and <name>_<i>.mcap files). To repair a single MCAP file, move it into "
                          "a folder of its own and repair that folder")
    try:
        metadata = read_metadata(bag)
        metadata_note = ""
    except (ValueError, OSError) as error:
        metadata, metadata_note = None, str(error)
    files, others, missing = bag_files(bag, metadata)
    if not files:
        raise RepairError(f"{bag} holds no .mcap file; only MCAP bags can be repaired here "
                          "(a sqlite3 bag is repaired by sqlite3's own recovery)")

    # First pass: read everything, change nothing; refuse what is not one repairable bag.
    collector = _Collector()
    scans: dict[Path, FileScan] = {}
    empty, not_mcap = [], []
    for path in files:
        if path.stat().st_size < len(MAGIC):
            empty.append(path)  # created, never written to: nothing to recover
            continue
        try:
            scans[path] = scan_mcap(path, collector.reader(path.name))
        except NotMcapError:
            not_mcap.append(path.name)
        except OSError as error:
            raise RepairError(f"cannot read {path}: {error}") from error
    if not scans and not not_mcap:
        raise RepairError(f"{bag}: its MCAP files {[p.name for p in empty]} are empty (the recorder wrote nothing "
                          "into them); there is nothing to recover. Nothing was changed")
    if not_mcap:
        raise RepairError(f"{', '.join(not_mcap)} in {bag} are not MCAP files (no MCAP magic bytes); this is "
                          "not a recorder's bag, or those files were replaced. Nothing was changed")
    session_ids = {name: s.session_id for name, s in collector.sessions.items()}
    if len(set(session_ids.values())) > 1:
        raise RepairError(f"the files of {bag} belong to different recording sessions {session_ids}; they are not "
                          "one bag. Move each session's files into a folder of its own. Nothing was changed")

    report = RepairReport(bag)
    all_stats: list[FileStats] = []
    for path in files:
        if path in empty:
            report.files.append(FileReport(path.name, "empty", 0, "no data written; left as it is, not listed"))
            continue
        scan = scans[path]
        stats = FileStats(path.name, scan.messages, scan.start_ns, scan.end_ns)
        if scan.intact:
            report.files.append(FileReport(path.name, "intact", scan.messages))
        else:
            kept = _recover(path, collector)
            report.changed += [f"rewrote {path.name} from its readable records", f"kept the original as {kept.name}"]
            lost = scan.lost_messages
            report.files.append(FileReport(path.name, "recovered", scan.messages,
                                           "; ".join(scan.problems()) + (f"; {lost} messages lost" if lost else "")))
        all_stats.append(stats)
        for topic, count in scan.topics.items():
            if topic in collector.topics:
                collector.topics[topic].message_count += count
    report.files += [FileReport(name, "missing", 0, "listed in metadata.yaml, not in the folder") for name in missing]
    report.files += [FileReport(name, "ignored", 0, "not in metadata.yaml: not part of this bag, left alone")
                     for name in others]

    found = {t.name: t.message_count for t in collector.topics.values()}
    report.topics = found
    listed = [s.path for s in all_stats]
    stale = metadata is None or bool(compare_counts(metadata, found)) or bool(missing) or \
        metadata.get("relative_file_paths") != listed or \
        [f.get("path") for f in metadata.get("files") or [] if isinstance(f, dict)] != listed
    custom: dict[str, str] = dict((metadata or {}).get("custom_data") or {})
    if SESSION_KEY in custom:
        try:
            report.session = SessionInfo.from_json(custom[SESSION_KEY])
        except (ValueError, TypeError):
            report.session = None
    if report.session is None and collector.sessions:
        session = next(iter(collector.sessions.values()))
        session.annotations = sorted(collector.annotations, key=lambda a: a.time_ns)
        custom[SESSION_KEY] = session.to_json()
        report.session = session
        stale = True
    if not stale and not report.changed:
        return report
    old = bag / "metadata.yaml"
    if old.exists():
        kept = free_name(bag / "metadata.yaml.before_repair")
        old.rename(kept)
        report.changed.append(f"kept the previous metadata.yaml as {kept.name}"
                              + (f" ({metadata_note})" if metadata_note else ""))
    custom[REPAIRED_KEY] = json.dumps([f.__dict__ for f in report.files])
    write_metadata(bag, metadata_dict(all_stats, list(collector.topics.values()), custom))
    report.changed.append("wrote metadata.yaml from the files")
    return report


def _recover(path: Path, collector: _Collector) -> Path:
    """Rewrite `path` from its readable records (a second read of the file); returns where
    the original was kept."""
    tmp = free_name(path.with_name(path.name + ".recovering"))
    out_channels: dict[int, int] = {}
    out_schemas: dict[int, int] = {}
    schemas: dict[int, Schema] = {}
    channels: dict[int, Channel] = {}
    with open(tmp, "xb") as target:
        writer = Writer(target, compression=CompressionType.ZSTD)
        writer.start(profile="ros2", library=LIBRARY + " (repaired)")

        def on_record(record) -> None:
            if isinstance(record, Schema):
                schemas[record.id] = record
            elif isinstance(record, Channel):
                channels[record.id] = record
            elif isinstance(record, Metadata):
                if record.name != "rosbag2":  # rosbag2's per-file summary describes the damaged file
                    writer.add_metadata(record.name, record.metadata)
            elif isinstance(record, Message):
                channel = channels.get(record.channel_id)
                if channel is None:
                    return
                if record.channel_id not in out_channels:
                    schema = schemas.get(channel.schema_id)
                    if schema is not None and schema.id not in out_schemas:
                        out_schemas[schema.id] = writer.register_schema(schema.name, schema.encoding, schema.data)
                    out_channels[record.channel_id] = writer.register_channel(
                        channel.topic, channel.message_encoding, out_schemas.get(channel.schema_id, 0),
                        channel.metadata)
                writer.add_message(out_channels[record.channel_id], record.log_time, record.data,
                                   record.publish_time, record.sequence)

        try:
            scan_mcap(path, on_record)
        except BaseException:
            target.close()
            tmp.unlink()
            raise
        writer.finish()
    kept = free_name(path.with_name(path.name + ".damaged"))
    path.rename(kept)
    tmp.rename(path)
    return kept
