"""Frames a source skipped against its declared rate are counted apart from drops (drops.py)."""
from __future__ import annotations

import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from twinloop_logging.drops import DeclaredRateError, TopicAccount, missing_periods, parse_declared_rates

STORE = get_typestore(Stores.ROS2_KILTED)
T0 = 1_700_000_000_000_000_000
PERIOD_NS = 66_666_667  # a camera declared at 15 Hz


def image_cdr(stamp_ns: int) -> bytes:
    t = STORE.types
    header = t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=stamp_ns // 10**9,
                                                                             nanosec=stamp_ns % 10**9), frame_id="cam")
    msg = t["sensor_msgs/msg/Image"](header=header, height=1, width=1, encoding="mono8", is_bigendian=0, step=1,
                                     data=np.zeros(1, dtype=np.uint8))
    return bytes(STORE.serialize_cdr(msg, "sensor_msgs/msg/Image"))


def feed(account: TopicAccount, frames: list[tuple[int, int]]) -> None:
    """(grid slot of the frame's stamp, publication sequence number); stamps jitter by up to 2 ms,
    as the emulated camera's do (the newest 500 Hz physics sample at render time)."""
    for slot, sequence in frames:
        jitter_ns = (slot * 7919) % 2_000_000
        account.on_message(image_cdr(T0 + slot * PERIOD_NS + jitter_ns), b"camera", sequence, T0 + slot * PERIOD_NS)
        account.written += 1


def test_a_camera_rendering_every_other_frame_is_counted_as_skipping_not_dropping():
    # Declared 15 Hz, delivers 7.5 Hz, every frame it sent arrived: 99 skipped, 0 dropped.
    declared = TopicAccount("/wrist_camera/color/image_raw", "sensor_msgs/msg/Image", has_header=True)
    declared.declare_rate(15.0)
    feed(declared, [(2 * k, k + 1) for k in range(100)])
    counts = declared.counts()
    assert (counts.source_skipped, counts.dropped_estimate, counts.received) == (99, 0, 100)
    assert counts.declared_rate_hz == 15.0
    # Without the declared rate the stream's own (halved) period hides the skips.
    undeclared = TopicAccount("/static_camera/color/image_raw", "sensor_msgs/msg/Image", has_header=True)
    feed(undeclared, [(2 * k, k + 1) for k in range(100)])
    assert undeclared.counts().source_skipped == 0 and undeclared.counts().dropped_estimate == 0


def test_gaps_the_sequence_numbers_explain_are_drops_the_rest_skips():
    account = TopicAccount("/wrist_camera/depth/image_rect_raw", "sensor_msgs/msg/Image", has_header=True)
    account.declare_rate(15.0)
    frames = [(slot, slot + 1) for slot in range(20)]  # on time
    frames += [(23, 21)]  # slots 20-22 never rendered (3 skipped), nothing lost
    frames += [(24, 22), (27, 24)]  # 25, 26 missing: sequence 23 lost (1 drop), one frame skipped
    frames += [(slot, slot - 3) for slot in range(28, 60)]
    feed(account, frames)
    counts = account.counts()
    assert counts.source_skipped == 4 and counts.sequence_gaps == 1 and counts.dropped_estimate == 1
    assert counts.stamp_gaps == 5 and counts.received == len(frames)


def test_skipped_frames_on_an_undeclared_stream_use_its_typical_period():
    account = TopicAccount("/camera/color/image_raw", "sensor_msgs/msg/Image", has_header=True)
    slots = [s for s in range(80) if s not in (40, 41, 60)]
    feed(account, [(slot, k + 1) for k, slot in enumerate(slots)])
    assert account.counts().source_skipped == 3 and account.counts().dropped_estimate == 0


def test_missing_periods_and_declared_rate_parsing():
    assert [missing_periods(d, 10) for d in (5, 10, 14, 15, 16, 25, 26, 39)] == [0, 0, 0, 0, 1, 1, 2, 3]
    rates = parse_declared_rates(["/(wrist|static)_camera/.*=15.0", "/joint_states=500"])
    assert [(p.pattern, hz) for p, hz in rates] == [("/(wrist|static)_camera/.*", 15.0), ("/joint_states", 500.0)]
    assert rates[0][0].fullmatch("/wrist_camera/color/image_raw") and not rates[0][0].fullmatch("/tf")
    for bad in ("/wrist_camera/.*", "/a=fast", "=15", "/a=0", "/a=-3", "/a=nan", "([=15"):
        with pytest.raises(DeclaredRateError, match="REGEX=HZ"):
            parse_declared_rates([bad])
