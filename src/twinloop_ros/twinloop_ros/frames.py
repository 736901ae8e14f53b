"""Frames over ROS: tf2_ros where it is importable (a ROS 2 install), the suite's own otherwise.

- `StaticFrames`: static transforms out on /tf_static (a calibration result):
  `tf2_ros.StaticTransformBroadcaster` where importable, else a latched TFMessage publisher
  with the broadcaster's topic and QoS (depth 1, transient local). Either way each message
  carries every transform the caller holds, since a late subscriber gets the last one only.
- `FrameLookup`: parent_T_child at a stamp. Where tf2_ros is importable, from a
  `tf2_ros.Buffer` filled by a `TransformListener` (what robot_state_publisher, the camera
  drivers and the calibration publish on /tf and /tf_static, interpolated at the stamp);
  without it, `lookup` returns None and the caller uses its own kinematics (pinocchio on the
  URDF from the measured joint states, `twinloop_twin.kinematics`), as the Kilted wheels
  offer no tf2_ros.
"""
from __future__ import annotations

import importlib.util

import numpy as np
from geometry_msgs.msg import TransformStamped
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.time import Time
from tf2_msgs.msg import TFMessage

from twinloop_ros.messages import stamp_from_ns, tf_msg
from twinloop_ros.qos import LATCHED
from twinloop_twin.kinematics import FrameTransform, quaternion_xyzw_to_matrix

TF2_ROS = importlib.util.find_spec("tf2_ros") is not None
LOOKUP_TIMEOUT_S = 0.1  # s a lookup waits for the transform to arrive


class StaticFrames:
    """Sends static transforms on /tf_static."""

    def __init__(self, node: Node) -> None:
        if TF2_ROS:
            import tf2_ros

            self._broadcaster = tf2_ros.StaticTransformBroadcaster(node)
            self._send = self._broadcaster.sendTransform
        else:
            self._publisher = node.create_publisher(TFMessage, "/tf_static", LATCHED)
            self._send = lambda transforms: self._publisher.publish(TFMessage(transforms=transforms))
        self.via = "tf2_ros.StaticTransformBroadcaster" if TF2_ROS else "a latched /tf_static publisher"

    def send(self, transforms: list[FrameTransform], stamp_ns: int) -> None:
        """Every static transform the caller holds (one message: the last one is what a late
        subscriber gets)."""
        self._send(list(tf_msg(transforms, stamp_from_ns(stamp_ns)).transforms))


class FrameLookup:
    """parent_T_child (4x4) at a stamp from tf2 where tf2_ros is importable; else None."""

    def __init__(self, node: Node, cache_s: float = 10.0) -> None:
        self.available = TF2_ROS
        if TF2_ROS:
            import tf2_ros

            self._buffer = tf2_ros.Buffer(cache_time=Duration(seconds=cache_s))
            self._listener = tf2_ros.TransformListener(self._buffer, node)
            self._errors = (tf2_ros.LookupException, tf2_ros.ConnectivityException, tf2_ros.ExtrapolationException)

    def lookup(self, parent: str, child: str, stamp_ns: int, timeout_s: float = LOOKUP_TIMEOUT_S) -> np.ndarray | None:
        """None without tf2_ros, or when tf2 cannot give it (unknown frame, stamp out of its
        buffer) within timeout_s."""
        if not self.available:
            return None
        try:
            found = self._buffer.lookup_transform(parent, child, Time(nanoseconds=stamp_ns),
                                                  timeout=Duration(seconds=timeout_s))
        except self._errors:
            return None
        return transform_matrix(found)


def transform_matrix(msg: TransformStamped) -> np.ndarray:
    """The 4x4 homogeneous matrix of a TransformStamped (parent_T_child)."""
    t, q = msg.transform.translation, msg.transform.rotation
    matrix = np.eye(4)
    matrix[:3, :3] = quaternion_xyzw_to_matrix(q.x, q.y, q.z, q.w)
    matrix[:3, 3] = (t.x, t.y, t.z)
    return matrix
