"""Latest simulated scene state, shared between the physics process and the camera process.

Rendering four 640x480 images holds the interpreter lock long enough to delay a 500 Hz
physics loop by tens of milliseconds, so the cameras render in their own process. They
only need the newest full MuJoCo state (qpos) and its stamp; a seqlock over shared
memory hands it over without locks or copies through DDS.
"""
from __future__ import annotations

import time
from multiprocessing import resource_tracker, shared_memory

import numpy as np

_HEADER = 3  # sequence counter, stamp in ns, nq


class SceneStateWriter:
    """Owned by the physics process; creates the shared block."""

    def __init__(self, nq: int, name: str | None = None) -> None:
        self._shm = shared_memory.SharedMemory(create=True, size=8 * (_HEADER + nq), name=name)
        self._header = np.ndarray((_HEADER,), dtype=np.int64, buffer=self._shm.buf)
        self._qpos = np.ndarray((nq,), dtype=np.float64, buffer=self._shm.buf, offset=8 * _HEADER)
        self._header[:] = (0, 0, nq)
        self.name = self._shm.name

    def write(self, qpos: np.ndarray, stamp_ns: int) -> None:
        self._header[0] += 1  # odd: a write is in progress
        self._qpos[:] = qpos
        self._header[1] = stamp_ns
        self._header[0] += 1  # even: consistent

    def close(self) -> None:
        del self._header, self._qpos
        self._shm.close()
        self._shm.unlink()


class SceneStateReader:
    """Used by the camera process; attaches to the writer's block by name."""

    def __init__(self, name: str) -> None:
        self._shm = shared_memory.SharedMemory(name=name)
        # The writer owns the block; without this the reader's tracker would unlink it.
        resource_tracker.unregister(self._shm._name, "shared_memory")  # noqa: SLF001
        header = np.ndarray((_HEADER,), dtype=np.int64, buffer=self._shm.buf)
        self._header = header
        self._qpos = np.ndarray((int(header[2]),), dtype=np.float64, buffer=self._shm.buf,
                                offset=8 * _HEADER)

    @property
    def nq(self) -> int:
        return self._qpos.shape[0]

    def read(self, timeout_s: float = 0.1) -> tuple[np.ndarray, int, int] | None:
        """(qpos copy, stamp_ns, sequence) of a consistent snapshot; None before the first write."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            seq = int(self._header[0])
            if seq == 0:
                return None
            if seq % 2 == 0:
                qpos = self._qpos.copy()
                stamp = int(self._header[1])
                if int(self._header[0]) == seq:
                    return qpos, stamp, seq
            time.sleep(0)
        return None

    def close(self) -> None:
        del self._header, self._qpos
        self._shm.close()
