"""The seqlock scene-state channel: exact hand-over, no torn snapshots across processes."""
from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np
import pytest

from twinloop_sim.scene_state import SceneStateReader, SceneStateWriter

HAMMER_S = 1.0
HAMMER_NQ = 512  # long enough that an unguarded copy overlaps a write often
WRITE_PERIOD_S = 10e-6


def _attach(writer: SceneStateWriter) -> SceneStateReader:
    """A reader in the writer's own process.

    The reader unregisters the block from its resource tracker (the writer owns it). The
    camera node runs in its own process with its own tracker; here the tracker is the
    writer's, so put the writer's registration back, or closing the writer makes the
    tracker log a KeyError.
    """
    reader = SceneStateReader(writer.name)
    resource_tracker.register(writer._shm._name, "shared_memory")  # noqa: SLF001
    return reader


@pytest.fixture
def writer():
    writer = SceneStateWriter(16)
    yield writer
    try:
        writer.close()
    except FileNotFoundError:
        pass  # the test closed it already


def test_read_before_first_write_returns_none_at_once(writer):
    reader = _attach(writer)
    try:
        start = time.monotonic()
        assert reader.read(timeout_s=1.0) is None
        assert time.monotonic() - start < 0.1  # "no state yet" is an answer, not a timeout
        assert reader.nq == 16
    finally:
        reader.close()


def test_round_trip_is_exact_and_the_sequence_counts_writes(writer):
    reader = _attach(writer)
    try:
        rng = np.random.default_rng(7)
        for count in range(1, 4):
            qpos = rng.normal(size=16) * 1e3
            qpos[0] = np.nextafter(1.0, 2.0)  # the last bit must survive
            stamp_ns = 1_700_000_000_123_456_789 + count
            writer.write(qpos, stamp_ns)
            snapshot = reader.read()
            assert snapshot is not None
            got, got_stamp, sequence = snapshot
            np.testing.assert_array_equal(got, qpos)
            assert got_stamp == stamp_ns
            assert sequence == 2 * count  # even: two increments per write
        got[:] = 0.0  # the snapshot is a copy, not a view of the shared block
        np.testing.assert_array_equal(reader.read()[0], qpos)
    finally:
        reader.close()


def _hammered_reader(name: str, ready, stop, results) -> None:
    """Child process: read until told to stop; count snapshots whose elements disagree."""
    # A spawn child shares its parent's resource tracker; the camera node, started with
    # Popen, has its own. Give this child its own too, so the reader's unregister does not
    # drop the writer's registration in the parent.
    tracker = resource_tracker._resource_tracker  # noqa: SLF001
    if tracker._fd is not None:  # noqa: SLF001
        os.close(tracker._fd)  # noqa: SLF001
        tracker._fd = None  # noqa: SLF001 - the next register() starts this child's own tracker
    reader = SceneStateReader(name)
    ready.set()
    reads = torn = stale_stamps = backwards = 0
    last_sequence = -1
    distinct = set()
    while not stop.is_set():
        snapshot = reader.read(timeout_s=0.05)
        if snapshot is None:
            continue
        qpos, stamp_ns, sequence = snapshot
        reads += 1
        if not np.all(qpos == qpos[0]):
            torn += 1
        if stamp_ns != int(qpos[0]) * 1000:
            stale_stamps += 1
        if sequence < last_sequence:
            backwards += 1
        last_sequence = sequence
        distinct.add(int(qpos[0]))
    reader.close()
    results.put({"reads": reads, "torn": torn, "stale_stamps": stale_stamps,
                 "backwards": backwards, "distinct": len(distinct)})


def test_reader_in_another_process_never_sees_a_torn_snapshot():
    context = multiprocessing.get_context("spawn")
    writer = SceneStateWriter(HAMMER_NQ)
    ready, stop, results = context.Event(), context.Event(), context.Queue()
    child = context.Process(target=_hammered_reader, args=(writer.name, ready, stop, results))
    writes = 0
    try:
        writer.write(np.zeros(HAMMER_NQ), 0)
        child.start()
        assert ready.wait(timeout=20.0), "reader process did not start"
        deadline = time.perf_counter() + HAMMER_S
        vector = np.empty(HAMMER_NQ)
        while (now := time.perf_counter()) < deadline:
            writes += 1
            vector.fill(float(writes))
            writer.write(vector, writes * 1000)
            # ~100 kHz, 200x the physics rate: back-to-back writes would starve the reader
            # (every read retried), and then "no torn read" would test nothing
            while time.perf_counter() - now < WRITE_PERIOD_S:
                pass
        stop.set()
        summary = results.get(timeout=10.0)
        child.join(timeout=10.0)
    finally:
        stop.set()
        if child.is_alive():
            child.terminate()
        writer.close()
    assert child.exitcode == 0
    # "zero torn" means something only if reads really overlapped writes: without the
    # sequence re-check this hammer shows hundreds of torn snapshots per second
    assert writes > 10_000 and summary["reads"] > 2_000 and summary["distinct"] > 100, (writes, summary)
    assert summary["torn"] == 0, summary
    assert summary["stale_stamps"] == 0, summary
    assert summary["backwards"] == 0, summary


def test_closing_the_writer_unlinks_the_block_and_closing_a_reader_does_not():
    writer = SceneStateWriter(4)
    name = writer.name
    reader = _attach(writer)
    reader.close()
    probe = shared_memory.SharedMemory(name=name)  # still there after the reader left
    probe.close()
    writer.close()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def test_writer_can_create_a_block_by_name():
    name = f"twinloop_test_{multiprocessing.current_process().pid}_{time.monotonic_ns()}"
    writer = SceneStateWriter(3, name=name)
    try:
        assert writer.name.lstrip("/") == name
        reader = _attach(writer)
        writer.write(np.array([1.0, 2.0, 3.0]), 42)
        qpos, stamp_ns, _ = reader.read()
        reader.close()
        np.testing.assert_array_equal(qpos, [1.0, 2.0, 3.0])
        assert stamp_ns == 42
    finally:
        writer.close()
