"""Per-topic drop accounting: what arrived, what should have arrived, what was lost.

Three independent witnesses, cheapest first:
- DDS publication sequence numbers (per publisher): gapless on the writer side, so a gap
  between two samples the recorder took is a sample it never got. The best witness; used
  whenever the middleware reports them (Fast DDS does).
- header stamps of a periodic stream: a gap of k nominal periods is k-1 missing samples.
  Only a fallback: a publisher that skips a period (a late camera frame) shows up as a
  gap even though nothing was lost on the way.
- DDS sample-lost events (the middleware's own count, a subset of the truth).
The recorder adds what it lost itself (write queue full, storage failed), which it knows exactly.
"""
from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

_STAMP = struct.Struct("<iI")
_STAMP_BE = struct.Struct(">iI")
STAMP_WINDOW = 64  # deltas kept to estimate a stream's nominal period
# While a reliable subscription is being matched, Fast DDS can hand the new (volatile)
# reader a few samples before the reliable session is up, with sequence gaps between
# them; samples before the match are outside the recording. Gaps in this first window
# after a topic's first sample are reported apart (`startup_gaps`), not as drops.
MATCH_SETTLE_NS = 100_000_000


def header_stamp_ns(cdr: bytes | memoryview) -> int | None:
    """Header stamp of a CDR message whose first field is std_msgs/Header, without
    deserializing it: the stamp's sec (int32) and nanosec (uint32) follow the 4-byte
    encapsulation header (byte 1: 0x01 little endian, 0x00 big endian)."""
    if len(cdr) < 12:
        return None
    sec, nanosec = (_STAMP if cdr[1] & 1 else _STAMP_BE).unpack_from(cdr, 4)
    return sec * 1_000_000_000 + nanosec


@dataclass
class TopicCounts:
    topic: str
    type: str
    received: int          # written to the bag
    expected: int
    dropped_estimate: int
    lost_reported: int     # DDS sample-lost events
    sequence_gaps: int     # missing publication sequence numbers
    stamp_gaps: int        # missing periods between header stamps (may be publisher-side skips)
    recorder_dropped: int  # taken from DDS but not written (queue full, storage failed)
    startup_gaps: int = 0  # sequence gaps while the subscription was being matched (not drops)
    rate_hz: float = 0.0


class TopicAccount:
    """Accounting of one topic; `on_message` is called for every sample taken from DDS."""

    def __init__(self, topic: str, msgtype: str, *, has_header: bool) -> None:
        self.topic, self.type, self.has_header = topic, msgtype, has_header
        self.taken = 0
        self.written = 0
        self.recorder_dropped = 0
        self.lost_reported = 0
        self.sequence_gaps = 0
        self.stamp_gaps = 0
        self.startup_gaps = 0
        self._first_ns: int | None = None
        self._last_sequence: dict[bytes, int] = {}
        self._sequence_seen = False
        self._last_stamp_ns: int | None = None
        self._deltas: deque[int] = deque(maxlen=STAMP_WINDOW)
        self._rate_mark = (0, 0)  # (taken, time_ns) at the last rate reading

    def on_message(self, data: bytes | memoryview, publisher: bytes | None, sequence: int | None,
                   receive_ns: int = 0) -> None:
        self.taken += 1
        if self._first_ns is None:
            self._first_ns = receive_ns
        if sequence:  # 0 / None: the middleware does not report sequence numbers
            self._sequence_seen = True
            last = self._last_sequence.get(publisher)
            if last is not None and sequence > last + 1:
                if receive_ns and receive_ns - self._first_ns < MATCH_SETTLE_NS:
                    self.startup_gaps += sequence - last - 1
                else:
                    self.sequence_gaps += sequence - last - 1
            self._last_sequence[publisher] = sequence
        if self.has_header:
            self._on_stamp(header_stamp_ns(data))

    def _on_stamp(self, stamp_ns: int | None) -> None:
        if stamp_ns is None:
            return
        last, self._last_stamp_ns = self._last_stamp_ns, stamp_ns
        if last is None or stamp_ns <= last:
            return
        delta = stamp_ns - last
        if len(self._deltas) >= 8:
            period = sorted(self._deltas)[len(self._deltas) // 2]
            if delta > 1.5 * period:
                self.stamp_gaps += round(delta / period) - 1
                return  # a gap is not a sample of the period
        self._deltas.append(delta)

    def on_lost(self, count_change: int) -> None:
        self.lost_reported += max(0, int(count_change))

    def counts(self, now_ns: int | None = None) -> TopicCounts:
        in_flight = self.sequence_gaps if self._sequence_seen else self.stamp_gaps
        expected = self.taken + max(in_flight, self.lost_reported)
        rate = 0.0
        if now_ns is not None:
            taken0, t0 = self._rate_mark
            if t0 and now_ns > t0:
                rate = (self.taken - taken0) * 1e9 / (now_ns - t0)
            self._rate_mark = (self.taken, now_ns)
        return TopicCounts(self.topic, self.type, self.written, expected, max(0, expected - self.written),
                           self.lost_reported, self.sequence_gaps, self.stamp_gaps, self.recorder_dropped,
                           self.startup_gaps, rate)
