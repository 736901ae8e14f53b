"""The trial sequence's cell over ROS (twinloop_policy.trials.TrialCell): the envelope monitor
and the recorder through twinloop_ros.clients, the scene reset and the operator through
their services. Attached to the runner's node; every call blocks the calling thread, so it
is called from a worker thread while the node's executor spins (see policy_runner_node).
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
from rclpy.node import Node
from twinloop_interfaces.msg import ErrorCode, SessionId
from twinloop_interfaces.srv import ConfirmReset, ResetWorkcell

from twinloop_policy.trials import TrialFailed, TrialPlan
from twinloop_ros.clients import ClientError, EnvelopeClient, RecorderClient, call_service, not_yet_recorded

SERVICE_WAIT_S = 5.0
CODE_NAMES = {getattr(ErrorCode, n): n for n in dir(ErrorCode) if n.isupper() and isinstance(getattr(ErrorCode, n), int)}


def failed(error: ClientError, what: str) -> TrialFailed:
    return TrialFailed(CODE_NAMES.get(error.code, "UNKNOWN"), f"{what}: {error}")


class RosTrialCell:
    def __init__(self, node: Node, *, monitor: str, recorder: str, reset_service: str, operator_service: str,
                 bag_dir: str, record_profile: str, run_policy: Callable[[float], tuple[bool, str]],
                 observations_missing: Callable[[], str]) -> None:
        self.envelope = EnvelopeClient(node, monitor=monitor)
        # (twinloop_planning.mover_node.LiveMover, the start pose in its joint order) for planned
        # trial resets; None: resets are not planned
        self.start_mover = None
        self.recorder = RecorderClient(node, recorder=recorder)
        self._reset = node.create_client(ResetWorkcell, reset_service)
        self._operator = node.create_client(ConfirmReset, operator_service)
        self._bag_dir, self._profile = bag_dir, record_profile
        self.run_policy, self.observations_missing = run_policy, observations_missing

    def monitor_faulted(self) -> bool:
        return self.envelope.faulted()

    def clear_fault(self, note: str) -> None:
        try:
            self.envelope.reset_fault(SERVICE_WAIT_S, note)
        except ClientError as error:
            raise failed(error, "clearing the envelope fault") from None

    def set_armed(self, armed: bool) -> None:
        try:
            self.envelope.set_armed(armed, SERVICE_WAIT_S)
        except ClientError as error:
            if error.code not in (ErrorCode.NOT_READY, ErrorCode.TIMEOUT):
                error.code = ErrorCode.ENVELOPE_VIOLATION  # the monitor answered and refused
            raise failed(error, f"{'arming' if armed else 'disarming'} the envelope monitor") from None

    def move_to_start(self) -> tuple[bool, str]:
        from twinloop_planning.planner import PlanningError

        if self.start_mover is None:
            return False, "planned resets are off (the runner's planned_reset parameter)"
        mover, start_pose = self.start_mover
        try:
            start, goal, trajectory = mover.plan_from_here(start_pose, SERVICE_WAIT_S)
            if len(trajectory.positions) == 1:
                return True, "not needed: the arm is at its start pose"
            mover.execute(trajectory, goal, SERVICE_WAIT_S)
        except PlanningError as error:
            return False, f"no plan ({error.code}): {error}"
        except ClientError as error:
            return False, f"the move failed: {error}"
        how = "around obstacles" if trajectory.sampled else "on the straight line"
        return True, (f"to the start pose {how}: joint path {trajectory.path_length_rad:.3f} rad "
                      f"(straight {np.linalg.norm(goal - start):.3f}), {trajectory.duration_s:.2f} s, planned in "
                      f"{trajectory.planning_s:.2f} s")

    def reset_scene(self) -> None:
        try:
            call_service(self._reset, ResetWorkcell.Request(reset_box=True), SERVICE_WAIT_S, "start the simulator")
        except ClientError as error:
            raise failed(error, "scene reset failed") from None

    def confirm_reset(self, index: int, note: str = "") -> tuple[bool, str]:
        prompt = f"reset the scene for trial {index}, then confirm" + (f" ({note})" if note else "")
        request = ConfirmReset.Request(prompt=prompt, trial_index=index)
        try:
            response = call_service(self._operator, request, SERVICE_WAIT_S, "start the operator's ConfirmReset service")
        except ClientError as error:
            raise failed(error, "asking the operator") from None
        return response.confirmed, response.operator_note

    def start_recording(self, session_id: str, index: int, plan: TrialPlan) -> str:
        try:
            return self.recorder.start(profile=self._profile, purpose=SessionId.PURPOSE_TRIAL, split=plan.split,
                                       output_dir=self._bag_dir, session_id=session_id, trial_index=index,
                                       twin_version=plan.twin_version, policy_version=plan.policy_version,
                                       note=f"policy runner trial {index} of {plan.num_trials}")
        except ClientError as error:
            raise failed(error, f"recorder refused trial {index}") from None

    def wait_until_recording(self, bag_path: str, topics: Sequence[str], timeout_s: float) -> list[str]:
        deadline = time.monotonic() + timeout_s
        while (missing := not_yet_recorded(self.recorder.status, bag_path, topics)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return missing

    def stop_recording(self) -> str:
        try:
            return self.recorder.stop()
        except ClientError as error:
            raise failed(error, "stopping the recording") from None

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)
