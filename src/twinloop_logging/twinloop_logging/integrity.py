"""Is a bag what its metadata says? Chunk-by-chunk reading of MCAP files, past damage.

Pure Python (no rclpy). `scan_mcap` reads one MCAP file record by record with the `mcap`
library's StreamReader, taking chunks whole (`emit_chunks`) and checking each one's CRC
itself, so that one damaged chunk costs only its own messages: reading goes on with the
next chunk. When bytes between chunks are unreadable, it resumes at the next chunk the
file's summary (if it survived) indexes. `check_bag` compares what the files hold with
`metadata.yaml`. `twinloop bag info` reports both; `twinloop bag repair` rewrites from the
same scan.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from mcap.exceptions import McapError
from mcap.reader import make_reader
from mcap.records import Channel, Chunk, DataEnd, Footer, Message, MessageIndex, Metadata, Schema
from mcap.stream_reader import StreamReader, breakup_chunk

MAGIC = b"\x89MCAP0\r\n"
# What damaged bytes make the mcap library raise while parsing or decompressing them.
DAMAGE_ERRORS: tuple[type[BaseException], ...] = (McapError, ValueError, EOFError, struct.error, RuntimeError,
                                                  OverflowError, MemoryError, IndexError)
try:  # zstd chunks: the mcap library decompresses them with `zstandard`
    import zstandard
    DAMAGE_ERRORS += (zstandard.ZstdError,)
except ImportError:  # pragma: no cover - mcap then refuses zstd chunks with McapError
    pass


class NotMcapError(ValueError):
    """The file does not start with the MCAP magic bytes: it is not an MCAP file."""


@dataclass
class ChunkDamage:
    offset: int           # byte offset of the unreadable chunk (or region) in the file
    length: int           # bytes lost
    messages: int | None  # messages it held according to the file's message index, None if unknown
    why: str

    def text(self) -> str:
        held = f", {self.messages} messages" if self.messages is not None else ""
        return f"bytes {self.offset}..{self.offset + self.length} unreadable ({self.why}{held})"


@dataclass
class FileScan:
    path: Path
    size: int
    has_summary: bool = False           # footer and summary readable
    complete: bool = False              # read up to the end of the data section
    messages: int = 0                   # messages read intact
    topics: dict[str, int] = field(default_factory=dict)
    start_ns: int = 0
    end_ns: int = 0
    damaged: list[ChunkDamage] = field(default_factory=list)
    orphans: int = 0                    # messages whose channel record is unreadable
    stopped: str = ""                   # why reading ended before the data section did

    @property
    def intact(self) -> bool:
        return self.has_summary and self.complete and not self.damaged and not self.orphans and not self.stopped

    @property
    def lost_messages(self) -> int | None:
        """Messages known to be lost in damaged chunks (None: some losses are uncounted)."""
        counts = [d.messages for d in self.damaged]
        return None if self.stopped or None in counts else sum(counts) + self.orphans

    def problems(self) -> list[str]:
        out = [f"{self.path.name}: {d.text()}" for d in self.damaged]
        if self.orphans:
            out.append(f"{self.path.name}: {self.orphans} messages whose channel record is unreadable")
        if self.stopped:
            out.append(f"{self.path.name}: {self.stopped}")
        elif not self.has_summary:
            out.append(f"{self.path.name}: no summary (the file was not closed)")
        return out


def is_mcap(path: Path) -> bool:
    with open(path, "rb") as stream:
        return stream.read(len(MAGIC)) == MAGIC


def scan_mcap(path: Path | str, on_record: Callable[[object], None] | None = None) -> FileScan:
    """Read every readable record of an MCAP file; `on_record` gets each Schema, Channel,
    Metadata and Message of the data section in file order. Raises NotMcapError when the
    file is not MCAP at all, OSError when it cannot be read."""
    path = Path(path)
    scan = FileScan(path, path.stat().st_size)
    with open(path, "rb") as stream:
        if stream.read(len(MAGIC)) != MAGIC:
            raise NotMcapError(f"{path} is not an MCAP file (it does not start with the MCAP magic bytes)")
        channels: dict[int, Channel] = {}
        chunk_starts: list[int] = []
        try:
            stream.seek(0)
            summary = make_reader(stream).get_summary()
        except DAMAGE_ERRORS + (KeyError,):
            summary = None

        def emit(record) -> None:
            if isinstance(record, (Schema, Channel, Metadata, Message)) and on_record is not None:
                on_record(record)
            if isinstance(record, Channel):
                channels[record.id] = record
            elif isinstance(record, Message):
                channel = channels.get(record.channel_id)
                if channel is None:
                    scan.orphans += 1
                    return
                scan.topics[channel.topic] = scan.topics.get(channel.topic, 0) + 1
                if not scan.messages or record.log_time < scan.start_ns:
                    scan.start_ns = record.log_time
                scan.end_ns = max(scan.end_ns, record.log_time)
                scan.messages += 1

        if summary is not None:
            # its schemas and channels first: a damaged chunk may have held the only copy
            scan.has_summary = True
            for schema in summary.schemas.values():
                emit(schema)
            for channel in summary.channels.values():
                emit(channel)
            chunk_starts = sorted(index.chunk_start_offset for index in summary.chunk_indexes)
        position = len(MAGIC)
        while not scan.complete:
            stream.seek(position)
            reader = StreamReader(stream, skip_magic=True, emit_chunks=True, record_size_limit=scan.size)
            damaged_chunk: ChunkDamage | None = None
            try:
                for record in reader.records:
                    start, position = position, stream.tell()
                    if isinstance(record, MessageIndex):
                        # the index written after a chunk says how many messages a damaged one held
                        if damaged_chunk is not None and damaged_chunk.messages is not None:
                            damaged_chunk.messages += len(record.records)
                        continue
                    damaged_chunk = None
                    if isinstance(record, Chunk):
                        try:
                            records = breakup_chunk(record, validate_crc=True)
                        except DAMAGE_ERRORS as error:
                            damaged_chunk = ChunkDamage(start, position - start, 0, _why(error))
                            scan.damaged.append(damaged_chunk)
                            continue
                        for inner in records:
                            emit(inner)
                    elif isinstance(record, (DataEnd, Footer)):
                        scan.complete = True
                        break
                    else:
                        emit(record)
                else:
                    scan.complete = True  # pragma: no cover - the reader ends only at a footer
            except DAMAGE_ERRORS as error:
                resume = next((offset for offset in chunk_starts if offset > position), None)
                if resume is not None:
                    scan.damaged.append(ChunkDamage(position, resume - position, None, _why(error)))
                    position = resume
                    continue
                if stream.tell() >= scan.size:
                    scan.stopped = f"the file ends inside a record at byte {position} of {scan.size}"
                else:
                    scan.stopped = (f"unreadable from byte {position} of {scan.size} ({_why(error)}); "
                                    "no index of a later chunk to resume from")
                break
    return scan


def _why(error: BaseException) -> str:
    text = str(error).strip()
    name = type(error).__name__
    if "crc" in text.lower():
        return "CRC mismatch"
    return f"{name}: {text}" if text else name


# ------------------------------------------------------------------------------ bags

@dataclass
class BagCheck:
    path: Path
    files: list[FileScan]
    topics: dict[str, int]               # messages per topic found in the files
    problems: list[str]                  # empty: the bag is what its metadata says

    @property
    def messages(self) -> int:
        return sum(self.topics.values())


def mcap_files(bag: Path, metadata: dict | None) -> list[Path]:
    """The bag's MCAP files: those metadata.yaml lists, else every *.mcap of the folder."""
    if metadata and metadata.get("relative_file_paths"):
        return [bag / name for name in metadata["relative_file_paths"]]
    return sorted(bag.glob("*.mcap"))


def read_metadata(bag: Path) -> dict | None:
    """`rosbag2_bagfile_information` of metadata.yaml; None when there is none. Raises
    ValueError when it is not rosbag2 metadata."""
    path = bag / "metadata.yaml"
    if not path.is_file():
        return None
    try:
        info = yaml.safe_load(path.read_text())["rosbag2_bagfile_information"]
    except (yaml.YAMLError, KeyError, TypeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not rosbag2 metadata ({type(error).__name__}: {error})") from error
    if not isinstance(info, dict):
        raise ValueError(f"{path} is not rosbag2 metadata (rosbag2_bagfile_information is not a mapping)")
    return info


def check_bag(path: Path | str) -> BagCheck:
    """Scan every MCAP file of a rosbag2 folder (or one bare MCAP file) and compare with
    metadata.yaml. Raises NotMcapError / ValueError / OSError on input that is no MCAP bag."""
    path = Path(path)
    metadata = None if path.is_file() else read_metadata(path)
    files = [path] if path.is_file() else mcap_files(path, metadata)
    problems: list[str] = []
    scans = []
    for file in files:
        if not file.is_file():
            problems.append(f"{file.name} is listed in metadata.yaml but missing")
            continue
        scan = scan_mcap(file)
        scans.append(scan)
        problems += scan.problems()
    topics: dict[str, int] = {}
    for scan in scans:
        for topic, count in scan.topics.items():
            topics[topic] = topics.get(topic, 0) + count
    if metadata is not None:
        problems += compare_counts(metadata, topics)
    return BagCheck(path, scans, topics, problems)


def compare_counts(metadata: dict, topics: dict[str, int]) -> list[str]:
    problems = []
    stated = metadata.get("message_count")
    found = sum(topics.values())
    if stated != found:
        problems.append(f"metadata.yaml says {stated} messages, the files hold {found}")
    for entry in metadata.get("topics_with_message_count") or []:
        try:
            name, count = entry["topic_metadata"]["name"], entry["message_count"]
        except (KeyError, TypeError):
            problems.append(f"metadata.yaml has a malformed topic entry {entry!r}")
            continue
        if count != topics.get(name, 0):
            problems.append(f"metadata.yaml says {count} messages on {name}, the files hold {topics.get(name, 0)}")
    listed = {(e.get("topic_metadata") or {}).get("name") for e in metadata.get("topics_with_message_count") or []
              if isinstance(e, dict)}
    unlisted = sorted(set(topics) - listed)
    if unlisted:
        problems.append(f"topics {unlisted} are in the files but not in metadata.yaml")
    return problems
