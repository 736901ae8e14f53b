"""Twin v0: built from urdf/ and config/, self-contained, immutable."""
import os

import mujoco
import numpy as np
import pytest

from twinloop_twin.bundle import TwinIntegrityError, TwinVersionExists, load_twin_version
from twinloop_twin.nominal import SCENE_FILE, build_nominal_twin, ensure_nominal_twin, load_scene
from twinloop_twin.physics import load_physics
from twinloop_twin.scene import compile_workcell
from twinloop_twin.workcell import default_config_dir, load_workcell


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    return build_nominal_twin(tmp_path_factory.mktemp("twins"), "emulated")


def test_v0_scene_loads_from_the_bundle_alone_and_matches_the_nominal_model(twin):
    model = load_scene(twin)
    reference = compile_workcell(load_workcell(), load_physics(default_config_dir() / "nominal_physics.yaml"))
    assert (model.nq, model.nv, model.nu, model.nbody, model.nmesh) == (
        reference.nq, reference.nv, reference.nu, reference.nbody, reference.nmesh)
    # MuJoCo writes MJCF numbers with 6 significant digits; twin.yaml keeps full precision.
    np.testing.assert_allclose(model.actuator_gainprm[:, 0], reference.actuator_gainprm[:, 0], rtol=1e-5)
    np.testing.assert_allclose(model.dof_damping, reference.dof_damping, rtol=1e-5)
    np.testing.assert_allclose(model.body_mass, reference.body_mass, rtol=1e-5)
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
    mujoco.mj_step(model, data, 1000)
    assert data.warning.number.sum() == 0
    # every asset the scene names lives inside the bundle
    for relative in twin.manifest.files:
        assert twin.file_path(relative).is_file()


def test_v0_parameters_are_the_nominal_physics_marked_unidentified(twin):
    physics = load_physics(default_config_dir() / "nominal_physics.yaml")
    parameters = twin.parameters
    assert parameters["box.mass_kg"].mean == physics.box.mass_kg
    assert parameters["command.delay_s"].mean == physics.command_delay_s
    assert parameters["actuator.panda_joint4.kp"].mean == physics.joints["panda_joint4"].kp
    assert all(not p.identifiable and p.std > 0 and p.source == "nominal" for p in parameters.values())
    assert twin.manifest.provenance.created_by == "nominal"
    assert twin.manifest.provenance.parent_version is None


def test_v0_is_never_rebuilt_and_a_tampered_scene_is_refused(tmp_path):
    build_nominal_twin(tmp_path, "emulated")
    with pytest.raises(TwinVersionExists):
        build_nominal_twin(tmp_path, "emulated")
    assert ensure_nominal_twin(tmp_path, "emulated").version == 0
    scene = load_twin_version(tmp_path, "emulated", 0).file_path(SCENE_FILE)
    os.chmod(scene, 0o644)
    scene.write_text(scene.read_text().replace('name="box"', 'name="crate"', 1))
    with pytest.raises(TwinIntegrityError, match=SCENE_FILE):
        load_twin_version(tmp_path, "emulated", 0)
