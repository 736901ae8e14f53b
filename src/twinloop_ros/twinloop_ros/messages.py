"""Conversions between numpy data and the hardware contract's messages."""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np
from builtin_interfaces.msg import Time
from geometry_msgs.msg import TransformStamped
from sensor_msgs.msg import CameraInfo, Image, JointState
from tf2_msgs.msg import TFMessage

from twinloop_twin.kinematics import FrameTransform, matrix_to_quaternion_xyzw
from twinloop_twin.workcell import CameraIntrinsics

if TYPE_CHECKING:  # imported where used: only the scene markers need it
    from visualization_msgs.msg import MarkerArray



class JointStateSample(Protocol):
    """One sample of the robot's state: joint names and arrays in that order."""

    names: tuple[str, ...]
    position: np.ndarray
    velocity: np.ndarray
    effort: np.ndarray


def stamp_from_ns(stamp_ns: int) -> Time:
    return Time(sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000)


def joint_state_msg(sample: JointStateSample, stamp: Time) -> JointState:
    msg = JointState()
    msg.header.stamp = stamp
    msg.name = list(sample.names)
    msg.position = sample.position.tolist()
    msg.velocity = sample.velocity.tolist()
    msg.effort = sample.effort.tolist()
    return msg


def tf_msg(transforms: list[FrameTransform], stamp: Time) -> TFMessage:
    out = []
    for transform in transforms:
        msg = TransformStamped()
        msg.header.stamp = stamp
        msg.header.frame_id = transform.parent
        msg.child_frame_id = transform.child
        t = transform.parent_T_child
        msg.transform.translation.x, msg.transform.translation.y, msg.transform.translation.z = (
            float(t[0, 3]), float(t[1, 3]), float(t[2, 3]))
        r = msg.transform.rotation
        r.x, r.y, r.z, r.w = matrix_to_quaternion_xyzw(t[:3, :3])
        out.append(msg)
    return TFMessage(transforms=out)


def image_msg(pixels: np.ndarray, encoding: str, frame_id: str, stamp: Time) -> Image:
    msg = Image()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.height, msg.width = pixels.shape[:2]
    msg.encoding = encoding
    msg.is_bigendian = 0
    msg.step = pixels.strides[0]
    # bytes, not the array: assigning a numpy array costs ~130 ms per 640x480 frame.
    msg.data = pixels.tobytes()
    return msg


def image_to_numpy(msg: Image) -> np.ndarray:
    """Inverse of image_msg for the encodings the workcell publishes."""
    dtype, channels = {"rgb8": (np.uint8, 3), "bgr8": (np.uint8, 3), "mono8": (np.uint8, 1),
                       "16UC1": (np.uint16, 1), "32FC1": (np.float32, 1)}[msg.encoding]
    array = np.frombuffer(bytes(msg.data), dtype=dtype)
    shape = (msg.height, msg.width) if channels == 1 else (msg.height, msg.width, channels)
    return array.reshape(shape)


def camera_info_msg(intrinsics: CameraIntrinsics, frame_id: str, stamp: Time) -> CameraInfo:
    msg = CameraInfo()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.width, msg.height = intrinsics.width, intrinsics.height
    msg.distortion_model = "plumb_bob"
    msg.d = [0.0] * 5  # rendered images have no lens distortion
    fx, fy, cx, cy = intrinsics.fx, intrinsics.fy, intrinsics.cx, intrinsics.cy
    msg.k = [fx, 0.0, cx, 0.0, fy, cy, 0.0, 0.0, 1.0]
    msg.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    msg.p = [fx, 0.0, cx, 0.0, 0.0, fy, cy, 0.0, 0.0, 0.0, 1.0, 0.0]
    return msg


def scene_markers(model, data, bodies: list[str], stamp: Time, namespace: str = "twin") -> "MarkerArray":
    """The named bodies' geoms as RViz markers in `world` (boxes, cylinders, spheres, meshes)."""
    import mujoco
    from visualization_msgs.msg import Marker, MarkerArray

    markers = []
    for body_name in bodies:
        body = model.body(body_name).id
        for geom in np.nonzero(model.geom_bodyid == body)[0]:
            if model.geom_group[geom] > 2:  # collision-only copies: the visual geom is drawn
                continue
            marker = Marker(ns=namespace, id=int(geom), action=Marker.ADD)
            marker.header.frame_id = "world"
            marker.header.stamp = stamp
            kind, size = model.geom_type[geom], model.geom_size[geom]
            if kind == mujoco.mjtGeom.mjGEOM_BOX:
                marker.type = Marker.CUBE
                marker.scale.x, marker.scale.y, marker.scale.z = (2 * size).tolist()
            elif kind == mujoco.mjtGeom.mjGEOM_CYLINDER:
                marker.type = Marker.CYLINDER
                marker.scale.x = marker.scale.y = float(2 * size[0])
                marker.scale.z = float(2 * size[1])
            elif kind == mujoco.mjtGeom.mjGEOM_SPHERE:
                marker.type = Marker.SPHERE
                marker.scale.x = marker.scale.y = marker.scale.z = float(2 * size[0])
            elif kind == mujoco.mjtGeom.mjGEOM_MESH:
                marker.type = Marker.TRIANGLE_LIST
                marker.scale.x = marker.scale.y = marker.scale.z = 1.0
                mesh = model.geom_dataid[geom]
                vertices = model.mesh_vert[model.mesh_vertadr[mesh]:model.mesh_vertadr[mesh] + model.mesh_vertnum[mesh]]
                faces = model.mesh_face[model.mesh_faceadr[mesh]:model.mesh_faceadr[mesh] + model.mesh_facenum[mesh]]
                from geometry_msgs.msg import Point
                marker.points = [Point(x=float(v[0]), y=float(v[1]), z=float(v[2])) for v in vertices[faces.reshape(-1)]]
            else:
                continue
            marker.pose.position.x, marker.pose.position.y, marker.pose.position.z = data.geom_xpos[geom].tolist()
            quat = np.zeros(4)
            mujoco.mju_mat2Quat(quat, data.geom_xmat[geom])
            o = marker.pose.orientation
            o.w, o.x, o.y, o.z = quat.tolist()
            r, g, b, a = model.geom_rgba[geom].tolist()
            marker.color.r, marker.color.g, marker.color.b, marker.color.a = r, g, b, a
            markers.append(marker)
    return MarkerArray(markers=markers)
