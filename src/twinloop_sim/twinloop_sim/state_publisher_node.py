"""State publisher: /tf from joint states and a URDF, as robot_state_publisher does.

Used where robot_state_publisher is not installed (the PyPI ROS 2 wheels lack it), e.g.
for the RViz "ghost" of the twin's predicted robot: joint states from
/twinloop/sim/joint_states, frames prefixed with `ghost/`. On a ROS 2 install the launch
files start the real robot_state_publisher instead. Kinematics: pinocchio
(twinloop_twin.kinematics).
"""
from __future__ import annotations

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import String
from tf2_msgs.msg import TFMessage

from twinloop_ros.messages import tf_msg
from twinloop_ros.node import StartupError, declare, run_node
from twinloop_ros.qos import LATCHED
from twinloop_twin.kinematics import FrameTransform, UrdfTransforms
from twinloop_twin.workcell import load_workcell


class StatePublisher(Node):
    def __init__(self) -> None:
        super().__init__("state_publisher")
        self.p = declare(self, {
            # Relative names, remappable as robot_state_publisher's are.
            "joint_states_topic": ("joint_states", "joint states to turn into transforms"),
            "frame_prefix": ("", "prefix of every published frame, e.g. 'ghost/'"),
            "root_frame_parent": ("", "if set with a prefix, attach <prefix><root> to this frame (e.g. 'world')"),
            "max_rate_hz": (50.0, "Hz, most /tf messages per second"),
        })
        try:
            urdf_xml = load_workcell().urdf_xml
        except (FileNotFoundError, ValueError) as error:
            raise StartupError(f"cannot load the workcell URDF: {error}") from error
        self.kinematics = UrdfTransforms(urdf_xml)
        self.tf_pub = self.create_publisher(TFMessage, "/tf", 10)
        static = [self._prefixed(t) for t in self.kinematics.static_transforms]
        if self.p["frame_prefix"] and self.p["root_frame_parent"]:
            root = self.kinematics.joints[0].parent
            static.append(FrameTransform(self.p["root_frame_parent"], self.p["frame_prefix"] + root, np.eye(4)))
        self.create_publisher(TFMessage, "/tf_static", LATCHED).publish(
            tf_msg(static, self.get_clock().now().to_msg()))
        self.create_publisher(String, "robot_description", LATCHED).publish(String(data=urdf_xml))
        self._min_period_ns = int(1e9 / self.p["max_rate_hz"])
        self._last_ns = 0
        self.create_subscription(JointState, self.p["joint_states_topic"], self.on_joint_states, 10)

    def _prefixed(self, transform: FrameTransform) -> FrameTransform:
        prefix = self.p["frame_prefix"]
        return FrameTransform(prefix + transform.parent, prefix + transform.child, transform.parent_T_child)

    def on_joint_states(self, msg: JointState) -> None:
        stamp_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        if stamp_ns - self._last_ns < self._min_period_ns:
            return
        self._last_ns = stamp_ns
        moving = self.kinematics.moving_transforms(dict(zip(msg.name, msg.position)))
        self.tf_pub.publish(tf_msg([self._prefixed(t) for t in moving], msg.header.stamp))


def main(args=None) -> None:
    run_node(StatePublisher, args)


if __name__ == "__main__":
    main()
