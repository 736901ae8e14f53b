"""The command stream a planned trajectory is sent on: fixed-period steps, held without a break."""
from __future__ import annotations

import threading
import time

import numpy as np

from twinloop_planning.execution import TargetStream, stream_targets


def test_stream_follows_the_path_then_holds_its_last_target():
    stream = TargetStream(np.zeros(2))
    assert np.array_equal(stream.next(), np.zeros(2)) and stream.idle()
    stream.follow([np.array([0.1, 0.0]), np.array([0.2, 0.0])])
    assert not stream.idle() and np.array_equal(stream.last, [0.2, 0.0])
    sent = [stream.next() for _ in range(4)]
    assert [s[0] for s in sent] == [0.1, 0.2, 0.2, 0.2] and stream.idle()


def test_streaming_publishes_every_period_until_stopped():
    stream = TargetStream(np.zeros(1))
    stream.follow([np.array([k * 0.01]) for k in range(1, 11)])
    published: list[tuple[float, float]] = []
    stop = threading.Event()
    thread = threading.Thread(target=stream_targets,
                              args=(stream, lambda q: published.append((time.monotonic(), float(q[0]))), 0.004, stop))
    thread.start()
    time.sleep(0.4)
    stop.set()
    thread.join(timeout=1.0)
    assert not thread.is_alive()
    values = [v for _, v in published]
    assert values[:10] == [k * 0.01 for k in range(1, 11)] and set(values[10:]) == {0.1}
    # ~100 steps in 0.4 s on a fixed schedule (a loaded host may stretch single periods)
    assert 80 <= len(published) <= 102, len(published)
