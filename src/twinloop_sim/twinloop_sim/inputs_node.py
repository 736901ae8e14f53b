"""What a simulated workcell loads at start-up: the workcell description and a physics file."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from twinloop_ros.node import StartupError
from twinloop_twin.physics import PhysicsConfigError, WorkcellPhysics
from twinloop_twin.scene import load_truth
from twinloop_twin.workcell import (ExampleRobotDataMissing, WorkcellConfigError, WorkcellDescription,
                                    default_config_dir, load_workcell)


@dataclass(frozen=True)
class SimInputs:
    workcell: WorkcellDescription
    physics: WorkcellPhysics
    physics_path: Path


def load_sim_inputs(truth_file: str, workcell_config: str, urdf: str,
                    default_physics: str = "emulated_truth.yaml") -> SimInputs:
    physics_path = Path(truth_file) if truth_file else default_config_dir() / default_physics
    try:
        workcell = load_workcell(workcell_config or None, urdf or None)
        physics = load_truth(physics_path, workcell)
    except (PhysicsConfigError, WorkcellConfigError, ExampleRobotDataMissing) as error:
        raise StartupError(str(error)) from error
    return SimInputs(workcell, physics, physics_path)
