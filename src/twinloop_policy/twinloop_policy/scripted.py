"""A hand-made TorchScript policy folder: a joint-space PD reach to a target.

Stands in for a trained export (same folder layout, same module interface) in tests and
the demo. The module keeps a reference trajectory (position, velocity) as buffers: on the
first step after `reset()` it starts at the observed joint positions, then follows a PD
law towards the goal with its acceleration and velocity clamped, and outputs the
reference as the position target. Its steps are therefore smooth enough to pass the
envelope monitor unchanged.

    twinloop policy scripted OUT_DIR [--goal j1 ... j7] [--rate 250] [--timeout 8]

OUT_DIR must not exist (or be an empty folder): a policy folder is never overwritten.
The folder is written beside its final place and renamed into it only once its
policy.yaml reads back, so a failure leaves nothing. Exit codes: 0 written; 2 bad input
(a value out of range, an existing OUT_DIR; one line on stderr says what to change).
"""
from __future__ import annotations

import argparse
import math
import numbers
import sys
from pathlib import Path
from typing import Sequence

from twinloop_policy.policy_spec import FORMAT, ObservationTerm, PolicySpec, PolicySpecError, write_policy_folder
from twinloop_twin.physics import ARM_JOINTS

MODULE_FILE = "policy.pt"
_LABELS = {"rate_hz": "rate_hz (--rate, Hz)", "timeout_s": "timeout_s (--timeout, s)"}


def write_scripted_policy(folder: Path | str, goal: Sequence[float], *, rate_hz: float = 250.0,
                          timeout_s: float = 8.0, tolerance_rad: float = 0.01, name: str = "scripted_reach",
                          version: str = "1", joints: Sequence[str] = ARM_JOINTS, max_age_s: float = 0.02,
                          observation_size: int | None = None) -> PolicySpec:
    """Write policy.pt + policy.yaml into the new folder `folder`. `observation_size`
    overrides the declared size (to build a deliberately mismatched folder).

    Raises PolicySpecError for a value out of range and FileExistsError when `folder`
    exists (unless it is an empty folder); nothing is written then."""
    goal = _check_values(goal, joints, rate_hz=rate_hz, timeout_s=timeout_s, tolerance_rad=tolerance_rad,
                         max_age_s=max_age_s)
    spec = PolicySpec(
        folder=Path(folder), name=name, version=version, module=MODULE_FILE, rate_hz=float(rate_hz),
        action_joints=tuple(joints),
        observation=(ObservationTerm("joint_position", "joint_position", tuple(joints),
                                     observation_size if observation_size is not None else len(joints),
                                     float(max_age_s)),),
        trial_timeout_s=float(timeout_s), goal_joint_positions=dict(zip(joints, goal)),
        goal_tolerance_rad=float(tolerance_rad), twin_version="", randomization={},
        training={"method": "scripted (not trained)", "format": FORMAT})

    def save(path: Path) -> None:
        import torch

        from twinloop_policy.scripted_module import ScriptedReach
        torch.jit.script(ScriptedReach(goal, 1.0 / rate_hz)).save(str(path))

    return write_policy_folder(folder, spec, save)


def _check_values(goal: Sequence[float], joints: Sequence[str], **positive: float) -> list[float]:
    """The goal as floats; raises PolicySpecError naming the first value out of range."""
    values = list(goal)
    if len(values) != len(joints):
        raise PolicySpecError(f"the goal has {len(values)} values for {len(joints)} joints {list(joints)}")
    for joint, value in zip(joints, values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise PolicySpecError(f"goal of {joint} must be a finite number of radians, got {value!r}")
    for name, value in positive.items():
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
            raise PolicySpecError(f"{_LABELS.get(name, name)} must be a finite number > 0, got {value!r}")
    return [float(v) for v in values]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path)
    parser.add_argument("--goal", type=float, nargs=7, help="arm joint targets, rad (default: home + 0.2 on joint 1)")
    parser.add_argument("--rate", type=float, default=250.0, help="Hz")
    parser.add_argument("--timeout", type=float, default=8.0, help="s per trial")


def run(args: argparse.Namespace) -> int:
    from twinloop_twin.workcell import WorkcellConfigError, load_workcell
    try:
        goal = args.goal
        if goal is None:
            home = load_workcell().home_arm_positions
            goal = [home[0] + 0.2] + home[1:]
        spec = write_scripted_policy(args.folder, goal, rate_hz=args.rate, timeout_s=args.timeout)
    except (PolicySpecError, WorkcellConfigError, OSError) as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip() not in ("", "^")]
        print(f"twinloop policy scripted: error: {' '.join(lines)}", file=sys.stderr)  # one line, YAML errors too
        return 2
    print(f"wrote {spec.folder / 'policy.yaml'} and {spec.module_path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop policy scripted", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
