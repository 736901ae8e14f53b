"""Shared fixtures of the builder's tests: the workcell, its nominal physics and scene, and
joint excitations on it (the shipped multi-sine with every arm joint at 0.4 rad)."""
from __future__ import annotations

import pytest

from twinloop_builder.excitation import JointExcitationConfig, joint_excitation
from twinloop_twin.physics import ARM_JOINTS, load_physics
from twinloop_twin.scene import build_workcell_spec
from twinloop_twin.workcell import default_config_dir, load_workcell

AMPLITUDE = {**{j: 0.4 for j in ARM_JOINTS}, "panda_finger_joint1": 0.0}


@pytest.fixture(scope="session")
def amplitude():
    return dict(AMPLITUDE)


@pytest.fixture(scope="session")
def workcell():
    return load_workcell()


@pytest.fixture(scope="session")
def nominal():
    return load_physics(default_config_dir() / "nominal_physics.yaml")


@pytest.fixture(scope="session")
def truth():
    return load_physics(default_config_dir() / "emulated_truth.yaml")


@pytest.fixture(scope="session")
def spec(workcell, nominal):
    return build_workcell_spec(workcell, nominal)


@pytest.fixture(scope="session")
def excitation(workcell, spec):
    """excitation(duration_s, seed, excite=None): a joint excitation starting and ending at home."""
    model = spec.compile()

    def make(duration_s: float, seed: int, excite=None):
        config = JointExcitationConfig(duration_s=duration_s, ramp_s=1.0, amplitude=AMPLITUDE, seed=seed)
        return joint_excitation(config, workcell.home_joint_positions, model, workcell.urdf_xml,
                                workcell.table_top_height_m, excite=excite)

    return make
