"""A truth file's unmodelled effects (Stribeck friction, backlash, a payload the description
lacks) act on the emulated workcell as their formulas say, and are off when absent."""
from __future__ import annotations

import dataclasses
import math

import mujoco
import numpy as np
import pytest

from twinloop_sim.workcell_sim import NO_NOISE, WorkcellSimulation
from twinloop_twin.nominal import default_config_dir, load_physics, load_workcell
from twinloop_twin.physics import (Backlash, CameraOffset, Payload, PhysicsConfigError, Stribeck, UnmodelledEffects,
                                   physics_from_dict, physics_to_dict)
from twinloop_twin.scene import PAYLOAD_BODY

TRUTH = default_config_dir() / "emulated_truth.yaml"


@pytest.fixture(scope="module")
def workcell():
    return load_workcell()


@pytest.fixture(scope="module")
def truth():
    return load_physics(TRUTH)


def _with(truth, **effects):
    return dataclasses.replace(truth, unmodelled=UnmodelledEffects(**effects))


def test_the_shipped_files_have_none_and_the_section_round_trips(truth):
    assert truth.unmodelled is None
    assert load_physics(default_config_dir() / "nominal_physics.yaml").unmodelled is None
    assert "unmodelled" not in physics_to_dict(truth)
    effects = _with(truth, stribeck=Stribeck(2.0, 0.03), backlash=Backlash("panda_joint4", 0.004),
                    payload=Payload(0.5, (0.0, 0.0, 0.1)),
                    camera_offsets=(CameraOffset("static_camera", (0.01, 0.0, -0.02), (0.0, 1.5, -2.0)),
                                    CameraOffset("wrist_camera", (0.0, 0.002, 0.0), (0.3, 0.0, 0.0))))
    assert physics_from_dict(physics_to_dict(effects)) == dataclasses.replace(effects, source="<dict>")


@pytest.mark.parametrize("section, key", [
    ({"stribeck": {"static_ratio": 0.5, "velocity_rad_s": 0.03}}, "unmodelled.stribeck.static_ratio"),
    ({"backlash": {"joint": "panda_finger_joint1", "width_rad": 0.004}}, "unmodelled.backlash.joint"),
    ({"backlash": {"joint": "panda_joint4", "width_rad": float("nan")}}, "unmodelled.backlash.width_rad"),
    ({"payload": {"mass_kg": 0.5, "offset_m": [0.0, 0.1]}}, "unmodelled.payload.offset_m"),
    ({"stiction": {}}, "unmodelled.stiction"),
    ({"camera_offsets": [0.01, 0.0, 0.0]}, "unmodelled.camera_offsets"),
    ({"camera_offsets": {"static_camera": {"xyz_m": [0.01, 0.0]}}}, "unmodelled.camera_offsets.static_camera.rpy_deg"),
    ({"camera_offsets": {"static_camera": {"xyz_m": [0.01, 0.0], "rpy_deg": [0, 0, 0]}}},
     "unmodelled.camera_offsets.static_camera.xyz_m"),
    ({"camera_offsets": {"static_camera": {"xyz_m": [0.0, 0.0, 0.0], "rpy_deg": [0, float("nan"), 0]}}},
     "unmodelled.camera_offsets.static_camera.rpy_deg"),
])
def test_a_bad_section_names_its_key(truth, section, key):
    raw = physics_to_dict(truth)
    raw["unmodelled"] = section
    with pytest.raises(PhysicsConfigError, match=key.replace(".", r"\.")):
        physics_from_dict(raw, source="truth.yaml")


def _hold(sim: WorkcellSimulation, seconds: float) -> np.ndarray:
    sim.step_until(sim.time_s + seconds)
    return np.array(list(sim.true_joint_positions().values()))


def test_a_payload_sags_the_arm_by_its_gravity_torque_over_the_gains(workcell, truth):
    """At rest the position actuators hold the payload's uncompensated weight: each joint is
    off its target by tau / kp, tau = J^T m g at the payload, within its friction band."""
    payload = Payload(0.6, (0.0, 0.0, 0.08))
    plain = WorkcellSimulation(workcell, truth, noise=NO_NOISE)
    loaded = WorkcellSimulation(workcell, _with(truth, payload=payload), noise=NO_NOISE)
    assert loaded.model.nq == plain.model.nq
    sag = _hold(loaded, 2.0) - _hold(plain, 2.0)
    model, data = loaded.model, loaded.data
    jacobian = np.zeros((3, model.nv))
    body = model.body(PAYLOAD_BODY).id
    mujoco.mj_jac(model, data, jacobian, None, data.xipos[body], body)
    names = list(loaded.joint_names)
    for index, joint in enumerate(names[:7]):
        dof = int(model.jnt_dofadr[model.joint(joint).id])
        tau = float(jacobian[:, dof] @ (payload.mass_kg * model.opt.gravity))
        kp = truth.joints[joint].kp
        band = 2.0 * truth.joints[joint].friction_loss / kp  # either side, for either model
        print(f"{joint}: sag {sag[index] * 1e3:+.3f} mrad, tau/kp {tau / kp * 1e3:+.3f} mrad")
        assert abs(sag[index] - tau / kp) <= band + 0.05 * abs(tau / kp) + 1e-5
    assert max(abs(sag[:7])) > 1e-3  # the payload matters: over a milliradian somewhere


def _ramp_lag(sim: WorkcellSimulation, joint: str, velocity: float, seconds: float) -> float:
    """Mean tracking lag of `joint` over the last half of a constant-velocity ramp."""
    start = sim.targets()[joint]
    lags = []
    for k in range(1, int(seconds * 1000) + 1):
        target = start + velocity * k * 1e-3
        sim.command([joint], [target])
        sim.step_until(k * 1e-3)
        if k > seconds * 500:
            lags.append(target - sim.true_joint_positions()[joint])
    return float(np.mean(lags))


def test_stribeck_friction_adds_its_low_speed_torque_to_the_lag(workcell, truth):
    """On a slow ramp the lag is the friction over kp: the Stribeck term adds
    (ratio - 1) * friction_loss * exp(-(v/vs)^2) * tanh(v / (0.1 vs)) / kp."""
    stribeck = Stribeck(2.5, 0.03)
    joint, velocity = "panda_joint1", 0.01
    plain = _ramp_lag(WorkcellSimulation(workcell, truth, noise=NO_NOISE), joint, velocity, 2.0)
    slow = _ramp_lag(WorkcellSimulation(workcell, _with(truth, stribeck=stribeck), noise=NO_NOISE), joint, velocity, 2.0)
    friction = truth.joints[joint].friction_loss
    extra = (stribeck.static_ratio - 1.0) * friction * math.exp(-(velocity / stribeck.velocity_rad_s) ** 2) \
        * math.tanh(velocity / (0.1 * stribeck.velocity_rad_s))
    expected = extra / truth.joints[joint].kp
    print(f"lag {plain * 1e3:.4f} -> {slow * 1e3:.4f} mrad, added {(slow - plain) * 1e3:.4f}, "
          f"expected {expected * 1e3:.4f}")
    assert slow - plain == pytest.approx(expected, rel=0.1)


def _settle_at(sim: WorkcellSimulation, joint: str, target: float, from_offset: float) -> float:
    sim.command([joint], [target + from_offset])
    sim.step_until(sim.time_s + 1.0)
    start = target + from_offset
    for k in range(1, 501):  # 0.5 s, slowly onto the target
        sim.command([joint], [start + (target - start) * k / 500])
        sim.step_until(sim.time_s + 1e-3)
    sim.step_until(sim.time_s + 1.0)
    return sim.true_joint_positions()[joint]


def test_backlash_opens_a_dead_band_as_wide_as_its_width(workcell, truth):
    """Approached from below and from above, a joint with backlash stops apart by about the
    width more than the same joint without it (whose band is its friction over kp)."""
    joint, width = "panda_joint4", 0.004

    def hysteresis(physics) -> float:
        sim = WorkcellSimulation(workcell, physics, noise=NO_NOISE)
        target = sim.targets()[joint]
        return _settle_at(sim, joint, target, +0.05) - _settle_at(sim, joint, target, -0.05)

    plain = hysteresis(truth)
    loose = hysteresis(_with(truth, backlash=Backlash(joint, width)))
    print(f"hysteresis {plain * 1e3:.3f} -> {loose * 1e3:.3f} mrad (width {width * 1e3:.1f})")
    assert loose - plain == pytest.approx(width, rel=0.1)


def test_effort_sensors_see_the_backlash_torque(workcell, truth):
    """The dead zone is in the transmission: the effort reported is what the actuator exerts."""
    joint = "panda_joint4"
    sim = WorkcellSimulation(workcell, _with(truth, backlash=Backlash(joint, 0.004)), noise=NO_NOISE)
    sim.command([joint], [sim.targets()[joint] + 0.0015])  # inside the half-width: nothing pushes
    sim.step_until(0.05)
    effort = sim.joint_state().effort[list(sim.joint_names).index(joint)]
    sim_plain = WorkcellSimulation(workcell, truth, noise=NO_NOISE)
    gravity = sim_plain.joint_state().effort[list(sim.joint_names).index(joint)]
    assert effort == pytest.approx(gravity, abs=0.3)


def test_the_truth_files_commented_example_parses(truth):
    """config/emulated_truth.yaml documents the section as a commented example: it must load."""
    import yaml

    lines = TRUTH.read_text().splitlines()
    start = lines.index("#   unmodelled:")
    block = []
    for line in lines[start:]:
        if not line.startswith("#   "):
            break
        block.append(line[2:])
    raw = physics_to_dict(truth)
    raw.update(yaml.safe_load("\n".join(block)))
    effects = physics_from_dict(raw).unmodelled
    assert effects == UnmodelledEffects(Stribeck(1.8, 0.05), Backlash("panda_joint4", 0.002),
                                        Payload(0.4, (0.0, 0.0, 0.08)),
                                        (CameraOffset("static_camera", (0.012, -0.008, 0.005), (0.8, -0.5, 1.2)),))
