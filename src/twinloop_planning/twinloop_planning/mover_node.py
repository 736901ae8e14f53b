"""A planned move on the robot, from where it is: read the measured joint state, plan,
arm the envelope monitor if it is disarmed, stream the plan on one of the monitor's inputs
at its command period, wait until the arm has settled at the goal, disarm what was armed
here. The ROS side of twinloop_planning, used by `twinloop plan move` and the policy
runner's trial resets; it rides on the caller's node, whose executor must spin while
`plan_from_here` and `execute` block (call them from another thread than the executor's,
or from a command line's session, whose executor spins in its own thread).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Mapping

import numpy as np
from rclpy.node import Node
from sensor_msgs.msg import JointState
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode

from twinloop_planning.execution import TargetStream, stream_targets
from twinloop_planning.planner import PlannedTrajectory, PlannerSettings, plan, start_from_measured
from twinloop_planning.scene import PlanningScene
from twinloop_ros.clients import ClientError, EnvelopeClient
from twinloop_ros.qos import COMMANDS, SENSOR

SETTLE_TOLERANCE_RAD = 0.01  # rad (m for the gripper): reached when every joint is this near the goal
SETTLE_TIMEOUT_S = 5.0
LEAD_HOLD_S = 0.1  # s of holds before the first step: the monitor references its first step to the measurement


class LiveMover:
    """Plans in `scene` from the measured joint state and makes the move through the monitor."""

    def __init__(self, node: Node, scene: PlanningScene, settings: PlannerSettings, monitor: EnvelopeClient, *,
                 command_topic: str = "/twinloop/planning/command", joint_states: str = "/joint_states",
                 positions: Callable[[], Mapping[str, float]] | None = None) -> None:
        """`positions`: the latest measured joint positions where the node already takes the
        joint states (the policy runner); None: subscribe to `joint_states` here."""
        self.node, self.scene, self.settings, self.monitor = node, scene, settings, monitor
        self.names = list(scene.joint_names)
        self.joint_states = joint_states
        self._measured: dict[str, float] = {}
        if positions is None:
            node.create_subscription(JointState, joint_states, self._on_joint_state, SENSOR)
            positions = lambda: self._measured  # noqa: E731 - the subscription's latest
        self._positions = positions
        self._publisher = node.create_publisher(JointState, command_topic, COMMANDS)

    def _on_joint_state(self, msg: JointState) -> None:
        self._measured.update(zip(msg.name, msg.position))

    def measured(self, timeout_s: float) -> np.ndarray:
        """The arm's position now (the scene's joint order); ClientError NOT_READY without one."""
        deadline = time.monotonic() + timeout_s
        while not all(j in (measured := self._positions()) for j in self.names):
            if time.monotonic() > deadline:
                raise ClientError(f"no {self.joint_states} with {', '.join(self.names)} within {timeout_s:.0f} s: "
                                  "start the robot driver (or the emulated workcell)", ErrorCode.NOT_READY)
            time.sleep(0.02)
        return np.array([measured[j] for j in self.names])

    def plan_from_here(self, goal: np.ndarray | Callable[[np.ndarray], np.ndarray], timeout_s: float
                       ) -> tuple[np.ndarray, np.ndarray, PlannedTrajectory]:
        """(start, goal, trajectory) from the measured position; `goal` may be a function of
        the start (e.g. a gripper that keeps its value). Raises PlanningError."""
        start = start_from_measured(self.measured(timeout_s), self.scene)
        goal = goal(start) if callable(goal) else np.asarray(goal, dtype=float)
        return start, goal, plan(start, goal, self.scene, self.settings)

    def execute(self, trajectory: PlannedTrajectory, goal: np.ndarray, timeout_s: float,
                progress: Callable[[str], None] = lambda text: None) -> None:
        """Stream `trajectory` through the monitor and wait until the arm settles at `goal`.
        ClientError: a latched fault before (NOT_READY) or during the move
        (ENVELOPE_VIOLATION), the monitor not there (NOT_READY/TIMEOUT), the goal not
        reached (UNKNOWN)."""
        status = self.ready(timeout_s)
        stream = TargetStream(trajectory.positions[0])
        stop = threading.Event()
        streamer = threading.Thread(target=stream_targets, args=(stream, self._publish, trajectory.period_s, stop),
                                    name="planned_targets", daemon=True)
        armed_here = status.state != EnvelopeStatus.STATE_ARMED
        streamer.start()
        try:
            time.sleep(LEAD_HOLD_S)
            if armed_here:
                self.monitor.arm(timeout_s)
            stream.follow(list(trajectory.positions[1:]))
            total = max(len(trajectory.positions) - 1, 1)
            while not stream.idle():
                self._raise_on_fault()
                progress(f"moving: {int(100 * (1 - stream.remaining() / total)) // 10 * 10} %")
                time.sleep(0.05)
            self._settle(goal)
        finally:
            if armed_here:
                self.monitor.disarm_nowait()
            stop.set()
            streamer.join(timeout=2.0)

    def ready(self, timeout_s: float) -> EnvelopeStatus:
        """The monitor's status once it answers; ClientError NOT_READY while it holds a fault."""
        status = self.monitor.wait_for_status(timeout_s)
        if self.monitor.faulted():
            raise ClientError(f"the envelope monitor has a latched fault ({self.monitor.fault_text()}): check the "
                              "cell, `twinloop monitor reset`, then move", ErrorCode.NOT_READY)
        return status

    def _publish(self, q: np.ndarray) -> None:
        msg = JointState(name=self.names, position=[float(v) for v in q])
        msg.header.stamp = self.node.get_clock().now().to_msg()
        self._publisher.publish(msg)

    def _settle(self, goal: np.ndarray) -> None:
        settled = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            self._raise_on_fault()
            measured = self._positions()
            error = np.abs(np.array([measured[j] for j in self.names]) - goal)
            if np.all(error < SETTLE_TOLERANCE_RAD):
                return
            if time.monotonic() > settled:
                worst = int(np.argmax(error))
                raise ClientError(f"the arm did not settle at the goal within {SETTLE_TIMEOUT_S:.0f} s "
                                  f"({self.names[worst]} {error[worst]:.3f} off)", ErrorCode.UNKNOWN)
            time.sleep(0.02)

    def _raise_on_fault(self) -> None:
        if self.monitor.faulted():
            raise ClientError(f"the envelope monitor stopped the move: {self.monitor.fault_text()}",
                              ErrorCode.ENVELOPE_VIOLATION)
