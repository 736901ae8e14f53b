"""The identification model: the twin's scene plus the sensors the residual compares, the
optimizer's variables and compiled candidates. Pure Python.

Joint names come from the workcell description (twinloop_twin.physics), which joint mimics
which from the scene's joint equalities (as twinloop_twin.usd_export reads them).
"""
from __future__ import annotations

import copy
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping, Sequence

import mujoco
import numpy as np

from twinloop_twin.model_parameters import apply_parameters
from twinloop_twin.physics import ALL_JOINTS

from twinloop_builder.identification.settings import BOX_BODY, DELAY, DELAY_UNIT_S

N_JOINTS = len(ALL_JOINTS)
POSITION_COLUMNS = slice(0, N_JOINTS)
EFFORT_COLUMNS = slice(N_JOINTS, 2 * N_JOINTS)
BOX_COLUMNS = slice(2 * N_JOINTS, 2 * N_JOINTS + 3)
N_SENSORS = 2 * N_JOINTS + 3


def identification_spec(spec: mujoco.MjSpec) -> mujoco.MjSpec:
    """The twin's scene plus the sensors the residual compares: joint positions, joint
    actuator efforts (what /joint_states reports as effort) and the box pose."""
    spec = spec.copy()
    for joint in ALL_JOINTS:
        spec.add_sensor(name=f"{joint}_pos", type=mujoco.mjtSensor.mjSENS_JOINTPOS,
                        objtype=mujoco.mjtObj.mjOBJ_JOINT, objname=joint)
    for joint in ALL_JOINTS:
        spec.add_sensor(name=f"{joint}_effort", type=mujoco.mjtSensor.mjSENS_JOINTACTFRC,
                        objtype=mujoco.mjtObj.mjOBJ_JOINT, objname=joint)
    spec.add_sensor(name="box_pos", type=mujoco.mjtSensor.mjSENS_FRAMEPOS, objtype=mujoco.mjtObj.mjOBJ_BODY,
                    objname=BOX_BODY)
    return spec


def base_model(spec: mujoco.MjSpec, *, contacts: bool, interpolate_delay: bool = False) -> mujoco.MjModel:
    """The identification model. With `interpolate_delay` the delayed command is read with
    linear interpolation, continuous in the delay (only while the delay is fitted; else
    zero-order hold, exactly as the twin's scene and the workcell act)."""
    model = identification_spec(spec).compile()
    if interpolate_delay:
        model.actuator_history[:, 1] = 1
    if not contacts:
        model.opt.disableflags |= mujoco.mjtDisableBit.mjDSBL_CONTACT
    return model


def mimic_leaders(model: mujoco.MjModel) -> dict[str, str]:
    """{follower joint: leader joint} of the scene's joint equalities (a URDF <mimic>)."""
    pairs = {}
    for equality in range(model.neq):
        if model.eq_type[equality] == mujoco.mjtEq.mjEQ_JOINT:
            pairs[model.joint(int(model.eq_obj1id[equality])).name] = model.joint(int(model.eq_obj2id[equality])).name
    return pairs


def prismatic_joints(model: mujoco.MjModel) -> set[str]:
    """Joints whose travel is in metres (slide joints), the rest in radians."""
    return {model.joint(i).name for i in range(model.njnt) if model.jnt_type[i] == mujoco.mjtJoint.mjJNT_SLIDE}


@dataclass(frozen=True)
class FitVariable:
    """One optimizer variable: log multiplier of prior values (tied names share it), or the delay."""

    name: str
    targets: tuple[str, ...]
    priors: tuple[float, ...]

    @property
    def is_delay(self) -> bool:
        return self.name == DELAY

    def x0(self, start: float | None = None) -> float:
        if self.is_delay:
            return (start if start is not None else self.priors[0]) / DELAY_UNIT_S
        return 0.0 if start is None else math.log(start / self.priors[0])

    def physical(self, x: float) -> dict[str, float]:
        if self.is_delay:
            return {DELAY: x * DELAY_UNIT_S}
        return {t: p * math.exp(x) for t, p in zip(self.targets, self.priors)}


class ModelFactory:
    """Compiled candidates: a copy of the base model with the candidate's values applied."""

    def __init__(self, base: mujoco.MjModel, variables: Sequence[FitVariable], fixed: Mapping[str, float],
                 cache_size: int = 96) -> None:
        self.base = base
        self.variables = list(variables)
        self.fixed = dict(fixed)
        self._cache: OrderedDict[bytes, mujoco.MjModel] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()  # segments of one candidate are rolled out from several threads

    def values(self, x: np.ndarray) -> dict[str, float]:
        values = dict(self.fixed)
        for variable, xi in zip(self.variables, np.ravel(x)):
            values.update(variable.physical(float(xi)))
        return values

    def build(self, x: np.ndarray) -> mujoco.MjModel:
        key = np.asarray(x, dtype=float).tobytes()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
            model = copy.copy(self.base)
            apply_parameters(model, self.values(x))
            self._cache[key] = model
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
            return model
