"""Physical parameters of a twin applied to, and read from, a compiled MuJoCo model.

Names follow `twinloop_twin.nominal.physics_parameters` (`joint.<j>.damping`,
`actuator.<j>.kp`, `command.delay_s`, `box.mass_kg`, ...). Writing into the compiled
model (not rebuilding the spec) lets the sim bridge draw a new sample from the twin's
posterior every episode and lets identification evaluate candidates cheaply. Pure Python.
"""
from __future__ import annotations

from typing import Mapping

import mujoco
import numpy as np

from twinloop_twin.parameters import ParameterSet
from twinloop_twin.scene import actuator_name_for_joint, command_delay_of, mujoco_actuator_delay

BOX_BODY = "box"
FINGER_BODIES = ("panda_leftfinger", "panda_rightfinger")


class ParameterApplicationError(ValueError):
    """A parameter name or value that the model cannot take."""


def apply_parameters(model: mujoco.MjModel, values: Mapping[str, float]) -> None:
    """Write parameter values into the model in place."""
    inertial_change = False
    for name, value in values.items():
        value = float(value)
        if not np.isfinite(value):
            raise ParameterApplicationError(f"parameter '{name}' is {value}: give a finite value")
        parts = name.split(".")
        group = parts[0]
        if group == "joint" and len(parts) == 3:
            _set_joint(model, parts[1], parts[2], value, name)
        elif group == "actuator" and len(parts) == 3:
            _set_actuator(model, parts[1], parts[2], value, name)
        elif name == "command.delay_s":
            _set_delay(model, value)
        elif name == "box.mass_kg":
            _set_mass(model, BOX_BODY, value)
            inertial_change = True
        elif name == "box.friction":
            _set_friction(model, (BOX_BODY,), value)
        elif name == "finger.friction":
            _set_friction(model, FINGER_BODIES, value)
        else:
            raise ParameterApplicationError(
                f"unknown parameter '{name}': expected joint.<joint>.friction_loss|damping|armature, "
                "actuator.<joint>.kp|kv, command.delay_s, box.mass_kg, box.friction or finger.friction")
        if group == "joint" and parts[-1] == "armature":
            inertial_change = True
    if inertial_change:
        # Masses and armature enter constants the compiler derived (subtree masses, the
        # inverse weights that scale contact softness); recompute them as compile would.
        mujoco.mj_setConst(model, mujoco.MjData(model))


def read_parameters(model: mujoco.MjModel, names: list[str]) -> dict[str, float]:
    """The model's current values of the named parameters (inverse of apply_parameters)."""
    out = {}
    for name in names:
        parts = name.split(".")
        if parts[0] == "joint":
            dof = model.jnt_dofadr[model.joint(parts[1]).id]
            field = {"friction_loss": model.dof_frictionloss, "damping": model.dof_damping,
                     "armature": model.dof_armature}[parts[2]]
            out[name] = float(field[dof])
        elif parts[0] == "actuator":
            actuator = model.actuator(actuator_name_for_joint(parts[1])).id
            out[name] = float(model.actuator_gainprm[actuator, 0] if parts[2] == "kp"
                              else -model.actuator_biasprm[actuator, 2])
        elif name == "command.delay_s":
            raw = float(model.actuator_delay[0])
            out[name] = raw if _interpolates(model) else command_delay_of(raw, model.opt.timestep)
        elif name == "box.mass_kg":
            out[name] = float(model.body_mass[model.body(BOX_BODY).id])
        elif name in ("box.friction", "finger.friction"):
            body = BOX_BODY if name == "box.friction" else FINGER_BODIES[0]
            out[name] = float(model.geom_friction[_collision_geoms(model, body)[0], 0])
        else:
            raise ParameterApplicationError(f"unknown parameter '{name}'")
    return out


def sample_parameters(parameters: ParameterSet, rng: np.random.Generator,
                      names: list[str] | None = None) -> dict[str, float]:
    """One draw from the twin's posterior: independent normals, truncated at zero.

    Every parameter here is physically non-negative; a draw below zero is redrawn
    (rejection keeps the distribution's shape above zero instead of piling mass at 0).
    """
    out = {}
    for name in names or list(parameters):
        p = parameters[name]
        value = rng.normal(p.mean, p.std)
        for _ in range(100):
            if value >= 0.0:
                break
            value = rng.normal(p.mean, p.std)
        out[name] = max(float(value), 0.0)
    return out


def _set_joint(model, joint: str, quantity: str, value: float, name: str) -> None:
    if value < 0:
        raise ParameterApplicationError(f"parameter '{name}' is negative ({value}): it must be >= 0")
    dof = model.jnt_dofadr[model.joint(joint).id]
    fields = {"friction_loss": model.dof_frictionloss, "damping": model.dof_damping,
              "armature": model.dof_armature}
    if quantity not in fields:
        raise ParameterApplicationError(f"unknown joint quantity in '{name}'")
    fields[quantity][dof] = value


def _set_actuator(model, joint: str, quantity: str, value: float, name: str) -> None:
    if value < 0:
        raise ParameterApplicationError(f"parameter '{name}' is negative ({value}): gains are >= 0")
    actuator = model.actuator(actuator_name_for_joint(joint)).id
    # MuJoCo's position servo: force = kp * ctrl - kp * q - kv * qdot
    if quantity == "kp":
        model.actuator_gainprm[actuator, 0] = value
        model.actuator_biasprm[actuator, 1] = -value
    elif quantity == "kv":
        model.actuator_biasprm[actuator, 2] = -value
    else:
        raise ParameterApplicationError(f"unknown actuator quantity in '{name}'")


def _set_delay(model, delay_s: float) -> None:
    capacity = model.actuator_history[:, 0].min() * model.opt.timestep
    if not 0.0 <= delay_s <= capacity + 1e-12:
        raise ParameterApplicationError(
            f"command.delay_s = {delay_s} is outside [0, {capacity}] s, the command history the "
            "scene was built with; rebuild the scene with a larger max_command_delay_s")
    # Zero-order hold acts in whole steps and is read half a step early (scene.py says why);
    # a linearly interpolated read is continuous in the delay and takes it as it is.
    model.actuator_delay[:] = delay_s if _interpolates(model) else mujoco_actuator_delay(delay_s, model.opt.timestep)


def _interpolates(model) -> bool:
    return bool(model.actuator_history[0, 1])


def _set_mass(model, body_name: str, mass_kg: float) -> None:
    if mass_kg <= 0:
        raise ParameterApplicationError(f"box.mass_kg must be > 0, got {mass_kg}")
    body = model.body(body_name).id
    # inertia scales with mass at fixed geometry
    model.body_inertia[body] *= mass_kg / model.body_mass[body]
    model.body_mass[body] = mass_kg


def _set_friction(model, bodies: tuple[str, ...], friction: float) -> None:
    if friction < 0:
        raise ParameterApplicationError(f"friction must be >= 0, got {friction}")
    for body in bodies:
        model.geom_friction[_collision_geoms(model, body), 0] = friction


def _collision_geoms(model, body_name: str) -> np.ndarray:
    body = model.body(body_name).id
    geoms = np.nonzero((model.geom_bodyid == body) & ((model.geom_contype != 0) | (model.geom_conaffinity != 0)))[0]
    return geoms
