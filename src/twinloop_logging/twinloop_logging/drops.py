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

Samples the source never produced are not drops, but a user must see them: a camera
declared at 15 Hz that renders 9 frames a second. Where sequence numbers are reported,
a stamp gap that the sequence numbers do not explain is the source's own
(`source_skipped`), counted against the stream's declared rate when one is given
(`declare_rate`), else against its typical period. Without sequence numbers the two
cannot be told apart and every stamp gap stays a possible drop.
"""
from __future__ import annotations

import re
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


class DeclaredRateError(ValueError):
    """A declared rate is malformed; the message names the entry and the form to write."""


def parse_declared_rates(entries: list[str]) -> list[tuple[re.Pattern, float]]:
    """['REGEX=HZ', ...] (the recorder's declared_rates) -> [(compiled REGEX, HZ)]."""
    rates = []
    for entry in entries:
        pattern, _, text = entry.rpartition("=")
        try:
            compiled, rate_hz = re.compile(pattern), float(text)
        except (re.error, ValueError) as error:
            raise DeclaredRateError(f"declared_rates entry {entry!r}: {error}; write 'REGEX=HZ', "
                                    "e.g. '/wrist_camera/.*=15.0'") from error
        if not pattern or not 0 < rate_hz < float("inf"):
            raise DeclaredRateError(f"declared_rates entry {entry!r}: write 'REGEX=HZ' with a finite rate > 0, "
                                    "e.g. '/wrist_camera/.*=15.0'")
        rates.append((compiled, rate_hz))
    return rates


def missing_periods(delta_ns: int, period_ns: float) -> int:
    """Samples missing between two of a periodic stream `delta_ns` apart: a gap of k
    periods (to the nearest whole period) is k-1 samples; jitter under half a period is none."""
    if period_ns <= 0 or delta_ns <= 1.5 * period_ns:
        return 0
    return round(delta_ns / period_ns) - 1


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
    source_skipped: int = 0  # periods the publisher never sent (stamp gaps without a sequence gap)
    declared_rate_hz: float = 0.0  # what the stamps were counted against; 0: the stream's own period


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
        self.source_skipped = 0
        self.declared_rate_hz = 0.0
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
        lost = 0
        if sequence:  # 0 / None: the middleware does not report sequence numbers
            self._sequence_seen = True
            last = self._last_sequence.get(publisher)
            if last is not None and sequence > last + 1:
                lost = sequence - last - 1
                if receive_ns and receive_ns - self._first_ns < MATCH_SETTLE_NS:
                    self.startup_gaps += lost
                else:
                    self.sequence_gaps += lost
            self._last_sequence[publisher] = sequence
        if self.has_header:
            missing = self._on_stamp(header_stamp_ns(data))
            if sequence and missing > lost:
                self.source_skipped += missing - lost

    def declare_rate(self, rate_hz: float) -> None:
        """Count stamp gaps against this rate (the source's declared rate, Hz) instead of
        the stream's own typical period, which a source that skips most frames hides."""
        self.declared_rate_hz = float(rate_hz)

    def _on_stamp(self, stamp_ns: int | None) -> int:
        """Periods missing before this stamp."""
        if stamp_ns is None:
            return 0
        last, self._last_stamp_ns = self._last_stamp_ns, stamp_ns
        if last is None or stamp_ns <= last:
            return 0
        delta = stamp_ns - last
        if self.declared_rate_hz > 0:
            missing = missing_periods(delta, 1e9 / self.declared_rate_hz)
            self.stamp_gaps += missing
            return missing
        if len(self._deltas) >= 8:
            missing = missing_periods(delta, sorted(self._deltas)[len(self._deltas) // 2])
            if missing:
                self.stamp_gaps += missing
                return missing  # a gap is not a sample of the period
        self._deltas.append(delta)
        return 0

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
                           self.startup_gaps, rate, self.source_skipped, self.declared_rate_hz)
