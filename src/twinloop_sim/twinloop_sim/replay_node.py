"""Replay server: replays recorded runs in a twin (action `~/replay`), publishes the twin's
predicted joint states on /twinloop/sim/joint_states for the RViz ghost, and writes the
twin's response as a bag."""
from __future__ import annotations

import time
from pathlib import Path

import mujoco
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import JointState
from twinloop_interfaces.action import Replay
from twinloop_interfaces.msg import ErrorCode

from visualization_msgs.msg import MarkerArray

from twinloop_ros.messages import scene_markers, stamp_from_ns
from twinloop_ros.node import declare, run_node
from twinloop_sim.replay import SIM_PREFIX, ReplayError, replay_bag
from twinloop_ros.qos import LATCHED, STREAM
from twinloop_twin.bundle import TwinError, latest_version, load_twin
from twinloop_twin.nominal import load_scene
from twinloop_twin.scene import SCENE_BODIES

GHOST_RATE_HZ = 50.0


class ReplayServer(Node):
    def __init__(self) -> None:
        super().__init__("replay_server")
        self.p = declare(self, {
            "twins_root": ("twins", "root folder of twin versions (for goals without twin_path)"),
            "workcell": ("emulated", "workcell name (for goals without twin_path)"),
            "output_dir": ("replays", "default folder of the twins' response bags"),
        })
        self.ghost_pub = self.create_publisher(JointState, f"{SIM_PREFIX}/joint_states", STREAM)
        # Reentrant group on a multi-threaded executor: a cancel request must get through
        # while a long replay runs in the execute callback.
        ActionServer(self, Replay, "~/replay", self.execute, goal_callback=lambda _: GoalResponse.ACCEPT,
                     cancel_callback=lambda _: CancelResponse.ACCEPT, callback_group=ReentrantCallbackGroup())
        self.scene_pub = self.create_publisher(MarkerArray, "/twinloop/twin/scene_markers", LATCHED)
        self._publish_twin_scene()

    def _publish_twin_scene(self) -> None:
        """The latest twin's scene (table, board, stand, box) for RViz, latched."""
        try:
            twin = load_twin(Path(self._latest_twin()))
        except (ReplayError, TwinError) as error:
            self.get_logger().info(f"no twin scene to show yet: {error}")
            return
        model = load_scene(twin)
        data = mujoco.MjData(model)
        mujoco.mj_resetDataKeyframe(model, data, model.key("home").id)
        mujoco.mj_kinematics(model, data)
        self.scene_pub.publish(scene_markers(model, data, SCENE_BODIES, self.get_clock().now().to_msg()))

    def execute(self, handle):
        goal: Replay.Goal = handle.request
        result = Replay.Result()

        def feedback(fraction: float, status: str) -> None:
            handle.publish_feedback(Replay.Feedback(progress=float(fraction), status=status))
            self.get_logger().info(f"replay {goal.bag_path}: {status}")
        try:
            twin_path = goal.twin_path or self._latest_twin()
            replayed, output = replay_bag(goal.bag_path, twin_path, goal.output_dir or self.p["output_dir"], feedback)
        except (ReplayError, TwinError, FileNotFoundError) as error:
            result.error = ErrorCode(code=ErrorCode.INVALID_ARGUMENT, message=str(error))
            self.get_logger().error(str(error))
            handle.abort()
            return result
        self._publish_ghost(replayed, goal.real_time, handle)
        if handle.is_cancel_requested:
            handle.canceled()
            result.error = ErrorCode(code=ErrorCode.CANCELED, message="canceled")
            return result
        result.error = ErrorCode(code=ErrorCode.NONE, message="")
        result.output_bag = str(output)
        result.joint_names = list(replayed.joint_names)
        result.joint_rmse_rad = [float(v) for v in replayed.joint_rmse_rad]
        result.end_effector_rmse_m = replayed.end_effector_rmse_m
        result.box_final_position_error_m = replayed.box_final_position_error_m
        result.time_offset_s = replayed.time_offset_s
        handle.succeed()
        return result

    def _publish_ghost(self, replayed, real_time: bool, handle) -> None:
        every = max(1, int(round(1.0 / (GHOST_RATE_HZ * (replayed.twin_t[1] - replayed.twin_t[0])))))
        start = time.monotonic()
        now_ns = self.get_clock().now().nanoseconds
        for k in range(0, len(replayed.twin_t), every):
            if handle.is_cancel_requested:
                return
            if real_time:
                time.sleep(max(0.0, start + replayed.twin_t[k] - time.monotonic()))
            msg = JointState(name=list(replayed.joint_names), position=replayed.twin_q[k].tolist())
            msg.header.stamp = stamp_from_ns(now_ns + int(replayed.twin_t[k] * 1e9))
            self.ghost_pub.publish(msg)

    def _latest_twin(self) -> str:
        root = Path(self.p["twins_root"])
        version = latest_version(root, self.p["workcell"])
        if version is None:
            raise ReplayError(f"no twin of workcell '{self.p['workcell']}' under {root}; give twin_path")
        return str(root / self.p["workcell"] / f"v{version}")


def main(args=None) -> None:
    run_node(ReplayServer, args, executor=lambda: MultiThreadedExecutor(num_threads=2))


if __name__ == "__main__":
    main()
