"""rosbag2 bags with MCAP storage: the `mcap` library writes the files, this module adds
what rosbag2 adds around them (one folder, `metadata.yaml`, splitting into
`<name>_<i>.mcap`, ros2 schemas and channel metadata).

Why not rosbags' own Writer: it writes a single file per bag (no size/duration split),
cannot flush a partial chunk on a timer (crash safety) and buffers a whole chunk in its
own format; the `mcap` library's Writer does all three, and rosbags still supplies the
message definitions, hashes and QoS serialization.
"""
from __future__ import annotations

import errno
import math
import numbers
import os
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path

import yaml
from mcap.writer import CompressionType, Writer
from rosbags.interfaces import Qos
from rosbags.rosbag2.metadata import dump_qos_v9

from twinloop_logging.session import BagExistsError
from twinloop_logging.typedefs import TypeDefinition

METADATA_VERSION = 9  # rosbag2 Jazzy/Kilted
STORAGE_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
MESSAGE_OVERHEAD = 31 + 16  # MCAP message record header + its message index entry
LIBRARY = "twinloop_logging/0.1.0 (mcap python writer)"


class StorageFullError(OSError):
    """The disk (or quota, or file size limit) is full; what was written before is kept."""


class BagOptionError(ValueError):
    """A writer option out of range (split size or duration, chunk size); nothing was created."""


def check_options(*, chunk_size: int, split_size_bytes: int, split_duration_s: float) -> None:
    """Raise BagOptionError naming the first option out of range."""
    for name, value, low in (("chunk_size", chunk_size, 1), ("split_size_bytes", split_size_bytes, 0)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
            raise BagOptionError(f"{name} must be a whole number of bytes >= {low}"
                                 f"{' (0: no size split)' if low == 0 else ''}, got {value!r}")
    if isinstance(split_duration_s, bool) or not isinstance(split_duration_s, numbers.Real) \
            or not math.isfinite(split_duration_s) or split_duration_s < 0:
        raise BagOptionError(f"split_duration_s must be a finite number of seconds >= 0 (0: no duration split), "
                             f"got {split_duration_s!r}")


@dataclass
class FileStats:
    path: str
    message_count: int = 0
    start_ns: int = 0
    end_ns: int = 0

    def add(self, time_ns: int) -> None:
        if not self.message_count or time_ns < self.start_ns:
            self.start_ns = time_ns
        self.end_ns = max(self.end_ns, time_ns)
        self.message_count += 1


@dataclass
class TopicEntry:
    name: str
    type: str
    rihs01: str
    qos: list[Qos] = field(default_factory=list)
    message_count: int = 0


def qos_yaml(qos: list[Qos]) -> str:
    return yaml.safe_dump(dump_qos_v9(qos), default_flow_style=False).strip() if qos else ""


def metadata_dict(files: list[FileStats], topics: list[TopicEntry], custom_data: dict[str, str]) -> dict:
    """rosbag2 `metadata.yaml` content (version 9), as `ros2 bag record` writes it for MCAP."""
    counted = [f for f in files if f.message_count]
    start = min((f.start_ns for f in counted), default=0)
    end = max((f.end_ns for f in counted), default=0)
    return {"rosbag2_bagfile_information": {
        "version": METADATA_VERSION,
        "storage_identifier": "mcap",
        "duration": {"nanoseconds": end - start},
        "starting_time": {"nanoseconds_since_epoch": start},
        "message_count": sum(f.message_count for f in files),
        "topics_with_message_count": [
            {"topic_metadata": {"name": t.name, "type": t.type, "serialization_format": "cdr",
                                "offered_qos_profiles": dump_qos_v9(t.qos), "type_description_hash": t.rihs01},
             "message_count": t.message_count} for t in topics],
        # Chunk compression is internal to MCAP: rosbag2 leaves these empty for it too.
        "compression_format": "",
        "compression_mode": "",
        "relative_file_paths": [f.path for f in files],
        "files": [{"path": f.path, "starting_time": {"nanoseconds_since_epoch": f.start_ns},
                   "duration": {"nanoseconds": f.end_ns - f.start_ns}, "message_count": f.message_count}
                  for f in files],
        "custom_data": dict(custom_data) or None,
        "ros_distro": os.environ.get("ROS_DISTRO", "kilted"),
    }}


def write_metadata(bag_dir: Path, metadata: dict) -> None:
    """Atomically (write + rename): a crash leaves the previous metadata.yaml, never half of one."""
    text = StringIO()
    yaml.safe_dump(metadata, text, default_flow_style=False, sort_keys=False)
    tmp = bag_dir / "metadata.yaml.tmp"
    tmp.write_text(text.getvalue())
    tmp.replace(bag_dir / "metadata.yaml")


class _DirectFile:
    """Unbuffered file for the mcap Writer: every record it emits (it emits whole chunks,
    never single messages) reaches the OS at once, so a SIGKILL loses only the chunk
    still being filled in memory. (The Writer would wrap a raw file in a BufferedWriter.)"""

    def __init__(self, path: Path) -> None:
        self._raw = open(path, "xb", buffering=0)

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        while view:
            view = view[self._raw.write(view):]  # a raw write may be partial
        return len(data)

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        pass

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def close(self) -> None:
        self._raw.close()


class BagWriter:
    """Writes one rosbag2 MCAP bag folder. Not thread-safe: one writer thread owns it."""

    def __init__(self, path: Path | str, *, compress: bool = False, chunk_size: int = 4 << 20,
                 split_size_bytes: int = 0, split_duration_s: float = 0.0,
                 file_metadata: dict[str, dict[str, str]] | None = None) -> None:
        self.path = Path(path)
        check_options(chunk_size=chunk_size, split_size_bytes=split_size_bytes, split_duration_s=split_duration_s)
        if self.path.exists():
            raise BagExistsError(f"bag folder {self.path} exists already; a session never overwrites a bag")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.mkdir()
        except FileExistsError as error:  # created by someone else between the check and here
            raise BagExistsError(f"bag folder {self.path} exists already") from error
        self.compression = CompressionType.ZSTD if compress else CompressionType.NONE
        self.chunk_size = chunk_size
        self.split_size_bytes = int(split_size_bytes)
        self.split_duration_ns = int(split_duration_s * 1e9)
        # Metadata records repeated at the start of every split file (e.g. the session), so
        # that any one file, repaired alone, still says what it belongs to.
        self.file_metadata = dict(file_metadata or {})
        self.custom_data: dict[str, str] = {}
        self.topics: dict[str, TopicEntry] = {}
        self.files: list[FileStats] = []
        self._channels: dict[str, int] = {}
        self._msgdefs: dict[str, str] = {}
        self._closed_bytes = 0
        self._stream = None
        self._writer: Writer | None = None
        self.closed = False
        self._open_file()
        self._guard(lambda: write_metadata(self.path, metadata_dict(self.files, list(self.topics.values()), {})))

    # -- files ---------------------------------------------------------------------------
    def _open_file(self) -> None:
        name = f"{self.path.name}_{len(self.files)}.mcap"
        self.files.append(FileStats(name))
        self._stream = _DirectFile(self.path / name)
        self._last_tell, self._pending_bytes = 0, 0
        self._writer = Writer(self._stream, chunk_size=self.chunk_size, compression=self.compression)
        self._guard(lambda: self._writer.start(profile="ros2", library=LIBRARY))
        schemas: dict[str, int] = {}
        self._channels = {}
        for entry in self.topics.values():
            self._register(entry, schemas)
        for name_, data in self.file_metadata.items():
            self._guard(lambda: self._writer.add_metadata(name_, data))
        self._schemas = schemas

    def _register(self, entry: TopicEntry, schemas: dict[str, int], msgdef: str | None = None) -> None:
        if entry.type not in schemas:
            text = msgdef if msgdef is not None else self._msgdefs[entry.type]
            schemas[entry.type] = self._guard(
                lambda: self._writer.register_schema(entry.type, "ros2msg", text.encode()))
        self._channels[entry.name] = self._guard(lambda: self._writer.register_channel(
            entry.name, "cdr", schemas[entry.type],
            {"offered_qos_profiles": qos_yaml(entry.qos), "topic_type_hash": entry.rihs01}))

    def _finish_file(self) -> None:
        current = self.files[-1]
        summary = metadata_dict([current], list(self.topics.values()), self.custom_data)
        text = yaml.safe_dump(summary["rosbag2_bagfile_information"], sort_keys=False)
        self._guard(lambda: self._writer.add_metadata("rosbag2", {"serialized_metadata": text}))
        self._guard(self._writer.finish)
        self._closed_bytes += self._stream.tell()
        self._stream.close()

    def split(self) -> None:
        """Finish the current file and continue in the next one (no message is lost: the
        same thread that writes messages splits, between two messages)."""
        self._finish_file()
        self._open_file()
        self._guard(self.write_metadata)

    # -- content -------------------------------------------------------------------------
    def add_topic(self, topic: str, definition: TypeDefinition, qos: list[Qos] | None = None) -> None:
        if topic in self.topics:
            return
        self._msgdefs[definition.msgtype] = definition.msgdef
        entry = TopicEntry(topic, definition.msgtype, definition.rihs01, list(qos or []))
        self.topics[topic] = entry
        self._register(entry, self._schemas, definition.msgdef)

    def write(self, topic: str, data: bytes | memoryview, log_time_ns: int, publish_time_ns: int = 0) -> None:
        current = self.files[-1]
        if current.message_count and (
                (self.split_size_bytes and self._file_size_estimate() + len(data) > self.split_size_bytes) or
                (self.split_duration_ns and log_time_ns - current.start_ns >= self.split_duration_ns)):
            self.split()
            current = self.files[-1]
        entry = self.topics[topic]
        self._guard(lambda: self._writer.add_message(
            self._channels[topic], log_time=log_time_ns, data=data,
            publish_time=publish_time_ns or log_time_ns, sequence=entry.message_count & 0xFFFFFFFF))
        entry.message_count += 1
        current.add(log_time_ns)
        self._pending_bytes += len(data) + MESSAGE_OVERHEAD

    def _file_size_estimate(self) -> int:
        """Bytes in the file plus the chunk being filled (counted uncompressed)."""
        tell = self._stream.tell()
        if tell != self._last_tell:  # a chunk went to the file
            self._last_tell, self._pending_bytes = tell, 0
        return tell + self._pending_bytes

    def add_metadata(self, name: str, data: dict[str, str]) -> None:
        self._guard(lambda: self._writer.add_metadata(name, data))

    def flush(self) -> None:
        """Close the chunk being filled and hand it to the OS (bounds what a crash loses)."""
        self._guard(self._writer.flush)

    def write_metadata(self) -> None:
        write_metadata(self.path, metadata_dict(self.files, list(self.topics.values()), self.custom_data))

    @property
    def bytes_written(self) -> int:
        return self._closed_bytes + (0 if self._stream.closed else self._stream.tell())

    @property
    def split_index(self) -> int:
        return len(self.files) - 1

    def close(self) -> None:
        """Finish the last file (summary, footer) and write metadata.yaml."""
        if self.closed:
            return
        self.closed = True
        self._finish_file()
        self._guard(self.write_metadata)

    def abandon(self) -> None:
        """After a storage failure: release the file without writing more to it."""
        self.closed = True
        try:
            self._stream.close()
        except OSError:
            pass

    def _guard(self, action):
        try:
            return action()
        except OSError as error:
            if error.errno in STORAGE_FULL:
                raise StorageFullError(
                    error.errno, f"storage full while writing {self.path} ({os.strerror(error.errno)}) "
                    f"after {self.bytes_written_safe()} bytes. Everything up to the last complete chunk is "
                    f"kept; free space, then run `twinloop bag repair {self.path}`") from error
            raise

    def bytes_written_safe(self) -> int:
        try:
            return self.bytes_written
        except (OSError, ValueError):
            return self._closed_bytes
