"""One recording session: thread-safe intake of serialized messages, a writer thread that
owns the bag, drop accounting, and the session metadata stored in the bag.

The intake (`put`) only counts and queues, so the thread taking messages from DDS never
waits for the disk; the writer thread writes, splits and flushes chunks on a timer.
"""
from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

from rosbags.interfaces import Qos

from twinloop_logging.bag_writer import BagWriter
from twinloop_logging.drops import TopicAccount, TopicCounts
from twinloop_logging.session import ANNOTATION_KEY, SESSION_KEY, Annotation, SessionInfo
from twinloop_logging.typedefs import TypeDefinition

STATS_KEY = "twinloop.topic_stats"
STOP_KEY = "twinloop.stop_reason"
MISSING_KEY = "twinloop.missing_topics"
SKIPPED_KEY = "twinloop.skipped_topics"


@dataclass
class RecordingOptions:
    compress: bool = False
    split_size_bytes: int = 0
    split_duration_s: float = 0.0
    chunk_size_bytes: int = 4 << 20
    flush_interval_s: float = 1.0     # a crash loses at most this much of every topic
    max_queue_bytes: int = 512 << 20  # beyond this the recorder drops (and counts) instead of growing


@dataclass
class RecordingSnapshot:
    recording: bool
    bag_path: str
    duration_s: float
    bytes_written: int
    split_index: int
    topics: list[TopicCounts]
    message: str


class SessionWriter:
    def __init__(self, path: Path | str, session: SessionInfo, options: RecordingOptions | None = None) -> None:
        self.options = options or RecordingOptions()
        self.session = session
        self.writer = BagWriter(path, compress=self.options.compress, chunk_size=self.options.chunk_size_bytes,
                                split_size_bytes=self.options.split_size_bytes,
                                split_duration_s=self.options.split_duration_s,
                                file_metadata={SESSION_KEY: {"json": session.to_json()}})
        self.path = self.writer.path
        self.accounts: dict[str, TopicAccount] = {}
        self.skipped: dict[str, str] = {}  # topic -> why it is not recorded
        self.failed: str | None = None
        self.stop_reason = ""
        self._queue: deque = deque()
        self._queued_bytes = 0
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self._started = time.monotonic()
        self._bytes_written = 0
        self._split_index = 0
        self._thread = threading.Thread(target=self._run, name="bag-writer", daemon=True)
        self._thread.start()

    # -- intake (any thread) -------------------------------------------------------------
    def add_topic(self, topic: str, definition: TypeDefinition, qos: list[Qos]) -> TopicAccount:
        account = TopicAccount(topic, definition.msgtype, has_header=definition.has_header)
        with self._wake:
            self.accounts[topic] = account
            self._queue.append(("topic", topic, definition, qos))
            self._wake.notify()
        return account

    def skip_topic(self, topic: str, why: str) -> None:
        self.skipped[topic] = why

    def put(self, topic: str, data: bytes, log_time_ns: int, publish_time_ns: int = 0,
            publisher: bytes | None = None, sequence: int | None = None) -> None:
        account = self.accounts[topic]
        account.on_message(data, publisher, sequence, log_time_ns)
        with self._wake:
            if self.failed or self._stopping or self._queued_bytes + len(data) > self.options.max_queue_bytes:
                account.recorder_dropped += 1
                return
            self._queue.append(("msg", topic, data, log_time_ns, publish_time_ns))
            self._queued_bytes += len(data)
            self._wake.notify()

    def annotate(self, note: str) -> Annotation:
        annotation = Annotation(time.time_ns(), note)
        with self._wake:
            self.session.annotations.append(annotation)
            self._queue.append(("meta", ANNOTATION_KEY, {"time_ns": str(annotation.time_ns), "note": note}))
            self._wake.notify()
        return annotation

    # -- writer thread -------------------------------------------------------------------
    def _run(self) -> None:
        next_flush = time.monotonic() + self.options.flush_interval_s
        while True:
            with self._wake:
                while not self._queue and not self._stopping:
                    if not self._wake.wait(timeout=max(0.0, next_flush - time.monotonic())):
                        break
                batch, self._queue = self._queue, deque()
                stopping = self._stopping
            try:
                for item in batch:
                    self._apply(item)
                if time.monotonic() >= next_flush:
                    self.writer.flush()
                    next_flush = time.monotonic() + self.options.flush_interval_s
                self._bytes_written = self.writer.bytes_written
                self._split_index = self.writer.split_index
            except Exception as error:  # storage full, I/O error: stop, keep what is written
                self._fail(error, batch)
                return
            if stopping and not self._queue:
                return

    def _apply(self, item) -> None:
        kind = item[0]
        if kind == "msg":
            _, topic, data, log_ns, pub_ns = item
            self.writer.write(topic, data, log_ns, pub_ns)
            with self._lock:
                self._queued_bytes -= len(data)
            self.accounts[topic].written += 1
        elif kind == "topic":
            self.writer.add_topic(item[1], item[2], item[3])
        else:
            self.writer.add_metadata(item[1], item[2])

    def _fail(self, error: Exception, batch) -> None:
        with self._wake:
            self.failed = str(error)
            self._queue.clear()
            for account in self.accounts.values():  # everything taken but not written is lost
                account.recorder_dropped = account.taken - account.written
        self.writer.abandon()
        try:
            self._store_custom_data()
            self.writer.write_metadata()
        except OSError as meta_error:
            self.failed += f" (metadata.yaml could not be updated either: {meta_error.strerror})"

    # -- state ---------------------------------------------------------------------------
    def counts(self, now_ns: int | None = None) -> list[TopicCounts]:
        return [a.counts(now_ns) for a in list(self.accounts.values())]

    def snapshot(self) -> RecordingSnapshot:
        message = self.failed or self.stop_reason or "recording"
        return RecordingSnapshot(not self._stopping and not self.failed, str(self.path),
                                 time.monotonic() - self._started, self._bytes_written, self._split_index,
                                 self.counts(time.time_ns()), message)

    def missing_topics(self, expected: list[str]) -> list[str]:
        return [t for t in expected if t not in self.accounts and t not in self.skipped]

    def _store_custom_data(self, missing: list[str] | None = None) -> None:
        data = self.writer.custom_data
        data[SESSION_KEY] = self.session.to_json()
        data[STATS_KEY] = json.dumps({c.topic: asdict(c) for c in self.counts()}, sort_keys=True)
        data[STOP_KEY] = self.failed or self.stop_reason
        if missing:
            data[MISSING_KEY] = json.dumps(missing)
        if self.skipped:
            data[SKIPPED_KEY] = json.dumps(self.skipped, sort_keys=True)

    def stop(self, reason: str = "stopped", *, expected_topics: list[str] | None = None,
             timeout_s: float = 60.0) -> RecordingSnapshot:
        """Write everything queued, store the final accounting, finalize the bag."""
        with self._wake:
            if not self.stop_reason:
                self.stop_reason = reason
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=timeout_s)
        if not self.failed and not self.writer.closed:
            missing = self.missing_topics(expected_topics or [])
            if missing:
                self.stop_reason += f"; expected topics never seen: {missing}"
            self._store_custom_data(missing)
            try:
                self.writer.close()
            except OSError as error:
                self.failed = str(error)
                self.writer.abandon()
        self._bytes_written = self.writer.bytes_written_safe()
        snapshot = self.snapshot()
        snapshot.recording = False
        return snapshot
