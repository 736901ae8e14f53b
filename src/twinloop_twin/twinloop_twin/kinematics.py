"""Robot kinematics from the workcell URDF, with pinocchio.

`UrdfTransforms` gives what robot_state_publisher publishes: `parent_T_child` of every
fixed joint (for /tf_static) and of every moving joint at given joint positions (for
/tf). The suite uses robot_state_publisher itself where it is installed; this serves
where it is not (the PyPI ROS 2 wheels lack it). Floating joints are skipped, as
robot_state_publisher skips them.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pinocchio as pin

MOVING_TYPES = ("revolute", "continuous", "prismatic")


@dataclass(frozen=True)
class UrdfJoint:
    name: str
    type: str
    parent: str
    child: str


@dataclass(frozen=True)
class FrameTransform:
    parent: str
    child: str
    parent_T_child: np.ndarray  # 4x4 homogeneous transform


class UrdfTransforms:
    """Forward kinematics of a URDF, link to link, by joint name."""

    def __init__(self, urdf_xml: str) -> None:
        self.model = pin.buildModelFromXML(urdf_xml)
        self._data = self.model.createData()
        root = ET.fromstring(urdf_xml)
        self.joints = [UrdfJoint(j.get("name"), j.get("type"), j.find("parent").get("link"),
                                 j.find("child").get("link")) for j in root.findall("joint")]
        self.moving_joint_names = [j.name for j in self.joints if j.type in MOVING_TYPES]
        self._frame_id = {f.name: i for i, f in enumerate(self.model.frames)
                          if f.type == pin.FrameType.BODY}
        self.static_transforms = self._transforms(
            pin.neutral(self.model), [j for j in self.joints if j.type == "fixed"])

    def configuration(self, positions: Mapping[str, float]) -> np.ndarray:
        """Pinocchio configuration vector with the named joints set, others neutral."""
        q = pin.neutral(self.model)
        for name, value in positions.items():
            if self.model.existJointName(name):
                joint = self.model.joints[self.model.getJointId(name)]
                if joint.nq == 1:
                    q[joint.idx_q] = value
        return q

    def moving_transforms(self, positions: Mapping[str, float]) -> list[FrameTransform]:
        return self._transforms(self.configuration(positions),
                                [j for j in self.joints if j.type in MOVING_TYPES])

    def world_T_link(self, link: str, positions: Mapping[str, float]) -> np.ndarray:
        pin.framesForwardKinematics(self.model, self._data, self.configuration(positions))
        return self._data.oMf[self._frame_id[link]].homogeneous.copy()

    def _transforms(self, q: np.ndarray, joints: list[UrdfJoint]) -> list[FrameTransform]:
        pin.framesForwardKinematics(self.model, self._data, q)
        oMf = self._data.oMf
        out = []
        for joint in joints:
            parent_T_child = oMf[self._frame_id[joint.parent]].actInv(oMf[self._frame_id[joint.child]])
            out.append(FrameTransform(joint.parent, joint.child, parent_T_child.homogeneous.copy()))
        return out


def matrix_to_quaternion_xyzw(rotation: np.ndarray) -> tuple[float, float, float, float]:
    """ROS ordering (x, y, z, w) of a rotation matrix's unit quaternion."""
    q = pin.Quaternion(np.asarray(rotation, dtype=float))
    q.normalize()
    return float(q.x), float(q.y), float(q.z), float(q.w)


def quaternion_xyzw_to_matrix(x: float, y: float, z: float, w: float) -> np.ndarray:
    """The rotation matrix of a quaternion in ROS ordering (normalized first)."""
    q = pin.Quaternion(float(w), float(x), float(y), float(z))
    q.normalize()
    return q.toRotationMatrix()
