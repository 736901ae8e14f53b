"""Serving a twin: the model loaded from a twin bundle behaves exactly as the physics it was
built from (no DDS timing in the way, unlike test/test_sim_bridge.py)."""
import numpy as np
import pytest

from twinloop_sim.workcell_sim import WorkcellSimulation
from twinloop_twin.nominal import build_nominal_twin, build_twin_from_physics, load_scene, load_twin_workcell
from twinloop_twin.physics import load_physics
from twinloop_twin.workcell import default_config_dir, load_workcell

JOINTS = ["panda_joint1", "panda_joint2", "panda_joint4", "panda_joint6"]


def _response(sim: WorkcellSimulation) -> np.ndarray:
    home = sim.workcell.home_joint_positions
    trajectory = []
    for offsets in ([0.25, 0.2, 0.3, -0.25], [-0.2, -0.15, -0.25, 0.3], [0.0] * 4):
        sim.command(JOINTS, [home[j] + o for j, o in zip(JOINTS, offsets)])
        for _ in range(500):
            sim.step_until(sim.time_s + 0.002)
            trajectory.append([sim.true_joint_positions()[j] for j in JOINTS])
    return np.array(trajectory)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("twins")
    truth = build_twin_from_physics(root, "emulated", default_config_dir() / "emulated_truth.yaml",
                                    created_by="test", source="truth", note="true physics", version=5)
    return {"nominal": build_nominal_twin(root, "emulated"), "truth": truth}


def test_twin_built_from_the_truth_reproduces_the_emulated_workcell(twins):
    workcell = load_workcell()
    emulated = _response(WorkcellSimulation(workcell, load_physics(default_config_dir() / "emulated_truth.yaml")))
    truth_twin = _response(WorkcellSimulation(load_twin_workcell(twins["truth"]), model=load_scene(twins["truth"])))
    nominal_twin = _response(WorkcellSimulation(load_twin_workcell(twins["nominal"]),
                                                model=load_scene(twins["nominal"])))
    # MJCF stores 6 significant digits, so "exact" is ~1e-6 rad here
    assert np.abs(truth_twin - emulated).max() < 1e-5
    assert np.sqrt(np.mean((nominal_twin - emulated) ** 2)) > 3e-3
