"""Rollouts as tasks on a Ray cluster: the same `run(episodes)` as rollouts.CarryRollouts.

Pure Python (ray, numpy, MuJoCo, torch; no rclpy). The twin's compiled model, the policy
module (its planned poses and student) and the task travel to the cluster once (ray.put);
each task runs a slice of the episodes with a CarryRollouts of its own (one thread) and
returns their ends in order. An episode's outcome depends only on its physics, box start,
view of the box and action (MuJoCo is deterministic), so the same seeds give the same
results on a cluster as here.

    rollouts = RayRollouts(local_rollouts, address="auto")   # or "ray://head:10001", or "local"

`address`: "local" starts a Ray instance on this machine (`workers` CPUs, bound to
127.0.0.1, no dashboard); anything else is passed to ray.init(address=...) (a running
cluster: `ray start --head` on the head node, `ray start --address HEAD:6379` on the others;
every node needs this twinloop and its Python dependencies installed).
"""
from __future__ import annotations

import math
from typing import Sequence

from twinloop_policy.rollouts import CarryRollouts, Episode
from twinloop_policy.task import EpisodeEnd


class ScaleOutError(RuntimeError):
    """Ray is missing or the cluster cannot be reached; the message says what to do."""


def _run_slice(model, policy, task, box_link: str, box_z_m: float, episodes: list[Episode]) -> tuple[list, int]:
    rollouts = CarryRollouts(model, policy, task, box_link, box_z_m, workers=1)
    ends = rollouts.run(episodes)
    return ends, rollouts.steps_taken


class RayRollouts:
    """CarryRollouts whose episodes run as Ray tasks (`chunks_per_worker` slices per CPU)."""

    def __init__(self, local: CarryRollouts, address: str, *, workers: int = 2, chunks_per_worker: int = 2) -> None:
        try:
            import ray
        except ImportError as error:
            raise ScaleOutError("ray is not installed: `pip install ray` (tools/requirements.txt pins it)") from error
        self._ray = ray
        self.policy, self.task = local.policy, local.task
        self.steps_taken = 0
        if not ray.is_initialized():
            try:
                if address == "local":
                    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                             _node_ip_address="127.0.0.1", configure_logging=False)
                else:
                    ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as error:
                raise ScaleOutError(f"cannot reach the Ray cluster at {address!r} ({error}); start it with "
                                    "`ray start --head`, or leave out --ray-address to run here") from error
        self.cpus = max(1, int(ray.cluster_resources().get("CPU", workers)))
        self.chunks = max(1, self.cpus * chunks_per_worker)
        self._task = ray.remote(num_cpus=1)(_run_slice)
        self._shared = [ray.put(v) for v in (local.model, local.policy, local.task)]
        self._box = (local.box_link, local.box_z_m)

    def run(self, episodes: Sequence[Episode]) -> list[EpisodeEnd]:
        episodes = list(episodes)
        if not episodes:
            return []
        size = math.ceil(len(episodes) / min(self.chunks, len(episodes)))
        slices = [episodes[i:i + size] for i in range(0, len(episodes), size)]
        futures = [self._task.remote(*self._shared, *self._box, part) for part in slices]
        ends: list[EpisodeEnd] = []
        for part_ends, steps in self._ray.get(futures):
            ends.extend(part_ends)
            self.steps_taken += steps
        return ends

    def close(self) -> None:
        if self._ray.is_initialized():
            self._ray.shutdown()
