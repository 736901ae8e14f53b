"""Identification sessions recorded in-process from a known physics file (no DDS).

The emulated workcell's own simulation class (twinloop_sim.workcell_sim.WorkcellSimulation)
runs a truth file with its sensor noise, stepped in 2 ms chunks with commands applied at
chunk starts, exactly as the emulated workcell node steps it; joint states are sampled
every chunk (500 Hz) and the box pose every 20 ms (the node's /tf rate). What is missing
compared with a bag of the node: DDS delivery jitter of the commands. Pure Python.
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

import numpy as np

from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.physics import COMMANDED_JOINTS, WorkcellPhysics
from twinloop_twin.workcell import WorkcellDescription

from twinloop_builder.excitation import JointTrajectory
from twinloop_builder.recording import Recording

# A segment is a trajectory, or a function of the box position planning one (a push).
Segment = Union[JointTrajectory, Callable[[np.ndarray], JointTrajectory]]


def simulate_session(workcell: WorkcellDescription, physics: WorkcellPhysics, segments: Sequence[Segment], *,
                     name: str = "synthetic", split: str = "fit", seed: int = 0, settle_s: float = 0.3,
                     chunk_s: float = 0.002, box_period_s: float = 0.02,
                     command_jitter_s: float = 0.0) -> Recording:
    """Play the segments one after another on the truth physics and record what a bag would hold.

    `command_jitter_s` > 0 delays each command's application by a random fraction of a
    chunk after its recorded time, as DDS delivery to the workcell does.
    """
    sim = WorkcellSimulation(workcell, physics, seed=seed)
    rng = np.random.default_rng(seed + 1)
    steps = int(round(chunk_s / sim.timestep_s))
    box_every = max(1, int(round(box_period_s / chunk_s)))
    state_t, position, velocity, effort, command_t, command, box_t, box_pose = [], [], [], [], [], [], [], []
    targets = sim.targets()

    def sample() -> None:
        state = sim.joint_state()
        state_t.append(sim.time_s)
        position.append(state.position)
        velocity.append(state.velocity)
        effort.append(state.effort)
        if (len(state_t) - 1) % box_every == 0:
            box_t.append(sim.time_s)
            box_pose.append(sim.box_qpos())

    def run_until(end_s: float, due: list[tuple[float, float, np.ndarray]]) -> None:
        while sim.time_s < end_s - 1e-9:
            now = sim.time_s
            while due and due[0][1] <= now + 1e-9:
                _, _, values = due.pop(0)
                sim.command(COMMANDED_JOINTS, values)
            sim.step_until(now + steps * sim.timestep_s)
            sample()

    sample()
    run_until(settle_s, [])
    for segment in segments:
        trajectory = segment if isinstance(segment, JointTrajectory) else segment(sim.box_qpos()[:3])
        start = sim.time_s
        due = []
        for t, row in zip(trajectory.t, trajectory.positions):
            log_t = start + t
            apply_t = log_t + (rng.uniform(0.0, command_jitter_s) if command_jitter_s > 0 else 0.0)
            due.append((log_t, apply_t, row))
            targets = dict(zip(COMMANDED_JOINTS, row))
            command_t.append(log_t)
            command.append([targets[j] for j in COMMANDED_JOINTS])
        if command_jitter_s > 0:
            # applied at the first chunk start at or after delivery
            due = [(lt, chunk_s * np.ceil(at / chunk_s - 1e-9), row) for lt, at, row in due]
        run_until(start + trajectory.duration_s + settle_s, due)
    return Recording(name, np.array(state_t), np.array(position), np.array(velocity), np.array(effort),
                     np.array(command_t), np.array(command), np.array(box_t), np.array(box_pose), split,
                     "identification", f"synthetic:{name}", "")
