"""Parameters written into a compiled model give the same physics as a model built with them."""
import mujoco
import numpy as np
import pytest

from twinloop_twin.model_parameters import (ParameterApplicationError, apply_parameters, read_parameters,
                                            sample_parameters)
from twinloop_twin.nominal import physics_parameters
from twinloop_twin.physics import load_physics
from twinloop_twin.scene import compile_workcell, reset_to_home
from twinloop_twin.workcell import default_config_dir, load_workcell


@pytest.fixture(scope="module")
def workcell():
    return load_workcell()


def _physics(name):
    return load_physics(default_config_dir() / f"{name}.yaml")


def _rollout(model, steps=600):
    data = mujoco.MjData(model)
    reset_to_home(model, data)
    data.ctrl[:7] += np.linspace(0.1, 0.3, 7)
    trajectory = []
    for _ in range(steps):
        mujoco.mj_step(model, data)
        trajectory.append(data.qpos.copy())
    return np.array(trajectory)


@pytest.mark.parametrize("truth", ["emulated_truth", "emulated_truth_slow"])
def test_nominal_model_with_truth_parameters_behaves_as_the_truth_model(workcell, truth):
    nominal = compile_workcell(workcell, _physics("nominal_physics"))
    reference = compile_workcell(workcell, _physics(truth))
    values = physics_parameters(_physics(truth), source="truth").means()
    apply_parameters(nominal, values)
    assert read_parameters(nominal, list(values)) == pytest.approx(values, rel=1e-12)
    for field in ("dof_frictionloss", "dof_damping", "dof_armature", "actuator_gainprm", "actuator_biasprm",
                  "actuator_delay", "body_mass", "body_inertia", "geom_friction"):
        np.testing.assert_allclose(getattr(nominal, field), getattr(reference, field), rtol=1e-12, err_msg=field)
    # identical physics: identical rollouts (same compiled structure, same numbers)
    np.testing.assert_allclose(_rollout(nominal), _rollout(reference), atol=1e-12)


def test_nominal_and_truth_rollouts_differ(workcell):
    nominal = _rollout(compile_workcell(workcell, _physics("nominal_physics")))
    truth = _rollout(compile_workcell(workcell, _physics("emulated_truth")))
    assert np.abs(nominal - truth).max() > 1e-3


def test_bad_parameters_are_refused(workcell):
    model = compile_workcell(workcell, _physics("nominal_physics"))
    with pytest.raises(ParameterApplicationError, match="unknown parameter 'joint.panda_joint1.stiction'|unknown joint"):
        apply_parameters(model, {"joint.panda_joint1.stiction": 1.0})
    with pytest.raises(ParameterApplicationError, match="negative"):
        apply_parameters(model, {"joint.panda_joint1.damping": -1.0})
    with pytest.raises(ParameterApplicationError, match="command history"):
        apply_parameters(model, {"command.delay_s": 1.0})
    with pytest.raises(ParameterApplicationError, match="finite"):
        apply_parameters(model, {"box.mass_kg": float("nan")})


def test_posterior_samples_have_the_twin_statistics_and_stay_physical():
    parameters = physics_parameters(_physics("nominal_physics"), source="nominal")
    rng = np.random.default_rng(4)
    draws = [sample_parameters(parameters, rng, ["box.mass_kg", "command.delay_s"]) for _ in range(4000)]
    masses = np.array([d["box.mass_kg"] for d in draws])
    mass = parameters["box.mass_kg"]
    # std = 50 % of the mean: truncation at zero removes ~2 % of the mass; mean within 5 %
    assert masses.mean() == pytest.approx(mass.mean, rel=0.05)
    assert masses.std() == pytest.approx(mass.std, rel=0.1)
    assert min(min(d.values()) for d in draws) >= 0.0
    # seeded: reproducible
    again = sample_parameters(parameters, np.random.default_rng(4), ["box.mass_kg", "command.delay_s"])
    assert again == draws[0]
