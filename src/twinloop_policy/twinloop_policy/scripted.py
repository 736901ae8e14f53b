"""A hand-made TorchScript policy folder: a joint-space PD reach to a target.

Stands in for a trained export (same folder layout, same module interface) in tests and
the demo. The module keeps a reference trajectory (position, velocity) as buffers: on the
first step after `reset()` it starts at the observed joint positions, then follows a PD
law towards the goal with its acceleration and velocity clamped, and outputs the
reference as the position target. Its steps are therefore smooth enough to pass the
envelope monitor unchanged.

    twinloop policy scripted OUT_DIR [--goal j1 ... j7] [--rate 250] [--timeout 8]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

import torch

from twinloop_policy.policy_spec import FORMAT, ObservationTerm, PolicySpec, write_policy_spec
from twinloop_twin.physics import ARM_JOINTS

MODULE_FILE = "policy.pt"


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


def write_scripted_policy(folder: Path | str, goal: Sequence[float], *, rate_hz: float = 250.0,
                          timeout_s: float = 8.0, tolerance_rad: float = 0.01, name: str = "scripted_reach",
                          version: str = "1", joints: Sequence[str] = ARM_JOINTS, max_age_s: float = 0.02,
                          observation_size: int | None = None) -> PolicySpec:
    """Write policy.pt + policy.yaml into `folder` (created). `observation_size` overrides
    the declared size (to build a deliberately mismatched folder)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    module = torch.jit.script(ScriptedReach(goal, 1.0 / rate_hz))
    module.save(str(folder / MODULE_FILE))
    spec = PolicySpec(
        folder=folder, name=name, version=version, module=MODULE_FILE, rate_hz=float(rate_hz),
        action_joints=tuple(joints),
        observation=(ObservationTerm("joint_position", "joint_position", tuple(joints),
                                     observation_size if observation_size is not None else len(joints), max_age_s),),
        trial_timeout_s=float(timeout_s), goal_joint_positions=dict(zip(joints, map(float, goal))),
        goal_tolerance_rad=float(tolerance_rad), twin_version="", randomization={},
        training={"method": "scripted (not trained)", "format": FORMAT})
    write_policy_spec(spec)
    return spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path)
    parser.add_argument("--goal", type=float, nargs=7, help="arm joint targets, rad (default: home + 0.2 on joint 1)")
    parser.add_argument("--rate", type=float, default=250.0, help="Hz")
    parser.add_argument("--timeout", type=float, default=8.0, help="s per trial")


def run(args: argparse.Namespace) -> int:
    from twinloop_twin.workcell import load_workcell
    goal = args.goal
    if goal is None:
        home = load_workcell().home_arm_positions
        goal = [home[0] + 0.2] + home[1:]
    spec = write_scripted_policy(args.folder, goal, rate_hz=args.rate, timeout_s=args.timeout)
    print(f"wrote {spec.folder / 'policy.yaml'} and {spec.module_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop policy scripted", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
