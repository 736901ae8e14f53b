"""The per-step forces of a truth file's unmodelled effects (Stribeck friction, backlash).

Pure Python (MuJoCo, numpy; no rclpy). MuJoCo's joint model has Coulomb friction at one
level and a linear position actuator: these two effects of a real arm are added here as
generalized forces (`qfrc_applied`), recomputed before every physics step. The payload,
the third effect, is a body in the compiled model, and a camera off its described mount
is placed there too (twinloop_twin.scene).
"""
from __future__ import annotations

import math

import mujoco
import numpy as np

from twinloop_twin.physics import ARM_JOINTS, UnmodelledEffects
from twinloop_twin.scene import (actuator_ids, camera_offset_transform, delayed_target, joint_dof_addresses,
                                 joint_qpos_addresses)

SMOOTHING = 0.1  # the Stribeck term's sign is tanh(v / (SMOOTHING * velocity)): no chatter at rest


class UnmodelledForces:
    """Forces of the effects a truth file names, for one model; `apply` before each step."""

    def __init__(self, model: mujoco.MjModel, effects: UnmodelledEffects) -> None:
        self.model = model
        self.effects = effects
        self._arm_dof = joint_dof_addresses(model, ARM_JOINTS)
        self._stribeck_extra = np.zeros(len(ARM_JOINTS))
        if effects.stribeck is not None:
            self._stribeck_extra = (effects.stribeck.static_ratio - 1.0) * model.dof_frictionloss[self._arm_dof]
        self._backlash = None
        if effects.backlash is not None:
            joint = effects.backlash.joint
            actuator = int(actuator_ids(model, [joint])[0])
            self._backlash = (int(joint_dof_addresses(model, [joint])[0]), int(joint_qpos_addresses(model, [joint])[0]),
                              actuator, float(model.actuator_gainprm[actuator, 0]), effects.backlash.width_rad / 2.0)
        self.actuator_extra = np.zeros(model.nv)  # the part of qfrc_applied the actuators exert (effort sensors see it)

    @property
    def active(self) -> bool:
        return bool(self._stribeck_extra.any()) or self._backlash is not None

    def apply(self, data: mujoco.MjData) -> None:
        data.qfrc_applied[:] = 0.0
        if self._stribeck_extra.any():
            velocity = data.qvel[self._arm_dof]
            scale = self.effects.stribeck.velocity_rad_s
            data.qfrc_applied[self._arm_dof] = -self._stribeck_extra * np.exp(-(velocity / scale) ** 2) * np.tanh(
                velocity / (SMOOTHING * scale))
        if self._backlash is not None:
            dof, qpos, actuator, kp, half_width = self._backlash
            target = delayed_target(self.model, data, actuator)
            error = target - float(data.qpos[qpos])
            # the position term acts only on the error beyond the dead zone: cancel its inside part
            cancel = -kp * min(max(error, -half_width), half_width)
            self.actuator_extra[dof] = cancel
            data.qfrc_applied[dof] += cancel

    def step(self, data: mujoco.MjData, steps: int) -> None:
        for _ in range(steps):
            self.apply(data)
            mujoco.mj_step(self.model, data)


def effects_text(effects: UnmodelledEffects) -> str:
    """One line for logs: which effects are on."""
    parts = []
    if effects.stribeck is not None:
        parts.append(f"Stribeck friction x{effects.stribeck.static_ratio:g} below "
                     f"{effects.stribeck.velocity_rad_s:g} rad/s")
    if effects.backlash is not None:
        parts.append(f"backlash {effects.backlash.width_rad * 1e3:g} mrad on {effects.backlash.joint}")
    if effects.payload is not None:
        parts.append(f"a {effects.payload.mass_kg:g} kg payload the description lacks")
    for offset in effects.camera_offsets:
        rotation = camera_offset_transform(offset)[:3, :3]
        angle = math.degrees(math.acos(max(-1.0, min(1.0, (np.trace(rotation) - 1.0) / 2.0))))
        parts.append(f"{offset.camera} {math.hypot(*offset.xyz_m) * 1e3:.1f} mm / {angle:.2f} deg off its described "
                     "mount")
    return ", ".join(parts) or "none"
