"""twinloop_ros.frames over DDS: static transforms sent by one session reach a late
subscriber of /tf_static (latched), as the calibration server sends its results; where
tf2_ros is importable (a ROS 2 install) they are looked up through its Buffer and
TransformListener, and without it a lookup says None (the caller's kinematics then)."""
from __future__ import annotations

import numpy as np
import pytest

from twinloop_ros.frames import TF2_ROS, FrameLookup, StaticFrames, transform_matrix
from twinloop_ros.process import fresh_domain_id
from twinloop_ros.qos import LATCHED
from twinloop_ros.session import RosSession
from twinloop_twin.kinematics import FrameTransform

pytestmark = pytest.mark.ros


def _pose(yaw: float, xyz) -> np.ndarray:
    pose = np.eye(4)
    pose[:3, :3] = [[np.cos(yaw), -np.sin(yaw), 0.0], [np.sin(yaw), np.cos(yaw), 0.0], [0.0, 0.0, 1.0]]
    pose[:3, 3] = xyz
    return pose


@pytest.fixture
def sessions():
    domain = fresh_domain_id()
    sender, receiver = RosSession(domain, "frames_sender"), RosSession(domain, "frames_receiver")
    yield sender, receiver
    receiver.close()
    sender.close()


def test_static_transforms_reach_a_late_subscriber(sessions):
    from tf2_msgs.msg import TFMessage

    sender, receiver = sessions
    world_T_camera = _pose(0.7, (0.9, 0.3, 1.2))
    hand_T_wrist = _pose(-1.2, (0.05, 0.0, 0.04))
    frames = StaticFrames(sender.node)
    frames.send([FrameTransform("world", "static_camera_calibrated", world_T_camera),
                 FrameTransform("panda_hand", "wrist_camera_calibrated", hand_T_wrist)], 1_700_000_000_123_000_000)
    received = receiver.collect(TFMessage, "/tf_static", LATCHED)  # subscribed after the send
    receiver.wait_for(lambda: received, 10.0, "the latched /tf_static message")
    transforms = {t.child_frame_id: t for t in received[-1][1].transforms}
    assert set(transforms) == {"static_camera_calibrated", "wrist_camera_calibrated"}
    assert transforms["wrist_camera_calibrated"].header.frame_id == "panda_hand"
    stamp = transforms["static_camera_calibrated"].header.stamp
    assert (stamp.sec, stamp.nanosec) == (1_700_000_000, 123_000_000)
    np.testing.assert_allclose(transform_matrix(transforms["static_camera_calibrated"]), world_T_camera, atol=1e-12)
    np.testing.assert_allclose(transform_matrix(transforms["wrist_camera_calibrated"]), hand_T_wrist, atol=1e-12)


@pytest.mark.skipif(TF2_ROS, reason="tf2_ros is importable: the lookup is tested through it below")
def test_without_tf2_ros_a_lookup_says_none(sessions):
    lookup = FrameLookup(sessions[1].node)
    assert not lookup.available and lookup.lookup("world", "panda_hand", 0) is None


@pytest.mark.skipif(not TF2_ROS, reason="tf2_ros is not importable (the ROS 2 wheels lack it)")
def test_a_static_transform_is_looked_up_through_tf2(sessions):
    sender, receiver = sessions
    world_T_camera = _pose(0.4, (1.0, 0.3, 1.1))
    lookup = FrameLookup(receiver.node)
    StaticFrames(sender.node).send([FrameTransform("world", "static_camera_calibrated", world_T_camera)],
                                   receiver.node.get_clock().now().nanoseconds)
    found = None
    for _ in range(50):
        found = lookup.lookup("world", "static_camera_calibrated", 0, timeout_s=0.2)  # 0: the latest
        if found is not None:
            break
    assert found is not None, "tf2 never had world -> static_camera_calibrated"
    np.testing.assert_allclose(found, world_T_camera, atol=1e-9)
