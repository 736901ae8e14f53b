"""The scripted reach as a TorchScript-able module (torch is imported only here, so the
command line checks its input before paying for torch)."""
from __future__ import annotations

from typing import Sequence

import torch


class ScriptedReach(torch.nn.Module):
    """Observation: arm joint positions (7). Action: arm joint position targets (7)."""

    def __init__(self, goal: Sequence[float], dt_s: float, kp: float = 16.0, kd: float = 8.0,
                 max_acceleration: float = 2.0, max_velocity: float = 0.5) -> None:
        super().__init__()
        self.register_buffer("goal", torch.tensor(list(goal), dtype=torch.float64))
        self.register_buffer("reference", torch.zeros(len(goal), dtype=torch.float64))
        self.register_buffer("velocity", torch.zeros(len(goal), dtype=torch.float64))
        self.register_buffer("started", torch.zeros(1, dtype=torch.bool))
        self.dt_s, self.kp, self.kd = dt_s, kp, kd
        self.max_acceleration, self.max_velocity = max_acceleration, max_velocity

    @torch.jit.export
    def reset(self) -> None:
        self.started.fill_(False)
        self.velocity.zero_()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if not bool(self.started[0]):
            self.reference.copy_(observation)
            self.started.fill_(True)
        acceleration = self.kp * (self.goal - self.reference) - self.kd * self.velocity
        acceleration = acceleration.clamp(-self.max_acceleration, self.max_acceleration)
        self.velocity.copy_((self.velocity + acceleration * self.dt_s).clamp(-self.max_velocity, self.max_velocity))
        self.reference.copy_(self.reference + self.velocity * self.dt_s)
        return self.reference.clone()
