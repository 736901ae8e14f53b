"""twinloop_ros.clients against the real nodes over DDS: an emulated workcell (no cameras)
behind the envelope monitor, the recorder and the replay server, each a subprocess on a
private localhost-only domain; the clients attach to the test's session node."""
from __future__ import annotations

import _thread
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode

from twinloop_logging.bag_reader import open_bag
from twinloop_ros.clients import ClientError, EnvelopeClient, GoalCanceled, RecorderClient, ReplayClient
from twinloop_ros.testing import EnvelopeCell, NodeProcess
from twinloop_twin.nominal import build_nominal_twin
from twinloop_twin.physics import ARM_JOINTS

pytestmark = pytest.mark.ros
WATCHDOGS = {"command_timeout_s": 0.5, "joint_state_timeout_s": 0.5}  # a shared 2-core host


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clients")
    cell = EnvelopeCell(tmp, WATCHDOGS)
    cell.tmp = tmp
    cell.twin = build_nominal_twin(tmp / "twins", "emulated")
    cell.extra += [
        NodeProcess("twinloop_logging.recorder_node", cell.domain_id, {"output_dir": str(tmp / "bags")},
                    log_path=tmp / "recorder.log"),
        NodeProcess("twinloop_sim.replay_node", cell.domain_id, {"twins_root": str(tmp / "twins")},
                    log_path=tmp / "replay.log"),
    ]
    yield cell
    cell.close()


def arm(monitor: EnvelopeClient) -> None:
    """monitor.arm(), retried for up to 5 s while the monitor sees no fresh joint state (a
    loaded host holds them back now and then; EnvelopeCell.prepare does the same)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            return monitor.arm()
        except ClientError as error:
            if "no fresh joint state" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_envelope_client_arms_disarms_and_resets_a_fault(cell):
    monitor = EnvelopeClient(cell.probe.node)
    assert monitor.wait_for_status().state == EnvelopeStatus.STATE_DISARMED
    arm(monitor)
    assert monitor.wait_for_state(EnvelopeStatus.STATE_ARMED).fault == EnvelopeStatus.FAULT_NONE
    monitor.disarm()
    monitor.wait_for_state(EnvelopeStatus.STATE_DISARMED)

    # One arm target 0.6 rad off the measured position: refused, the fault latches.
    arm(monitor)
    measured = cell.measured()
    cell.command({**{j: measured[j] for j in ARM_JOINTS}, "panda_joint1": measured["panda_joint1"] + 0.6})
    fault = monitor.wait_for_state(EnvelopeStatus.STATE_FAULT)
    assert monitor.faulted() and fault.reason in monitor.fault_text() and list(fault.joint_names) == ["panda_joint1"]
    with pytest.raises(ClientError) as refused:
        monitor.arm()
    assert refused.value.code == ErrorCode.NOT_READY and "reset it first" in str(refused.value)
    response = monitor.reset_fault(note="test: checked")
    assert response.cleared_fault == fault.fault
    monitor.wait_for_state(EnvelopeStatus.STATE_ARMED)  # the monitor re-arms on a reset
    monitor.disarm()
    monitor.wait_for_state(EnvelopeStatus.STATE_DISARMED)
    assert monitor.reset_fault().cleared_fault == EnvelopeStatus.FAULT_NONE


def test_a_missing_node_is_a_not_ready_error_within_the_timeout(cell):
    started = time.monotonic()
    with pytest.raises(ClientError) as missing:
        EnvelopeClient(cell.probe.node, monitor="/no_monitor").arm(timeout_s=0.5)
    assert missing.value.code == ErrorCode.NOT_READY and "start the envelope monitor" in str(missing.value)
    with pytest.raises(ClientError) as missing:
        ReplayClient(cell.probe.node, server="/no_replay").send(None, server_timeout_s=0.5)
    assert missing.value.code == ErrorCode.NOT_READY and "/no_replay/replay" in str(missing.value)
    assert time.monotonic() - started < 5.0


@pytest.fixture(scope="module")
def recorded(cell):
    """A session recorded through RecorderClient while a ramp on joint 1 runs through the monitor."""
    recorder = RecorderClient(cell.probe.node)
    assert recorder.wait_for_recorder() is None  # no session since it started: no status yet
    bag = recorder.start(profile="identification", purpose="identification", split="fit",
                         output_dir=str(cell.tmp / "bags"), note="clients test")
    recorder.wait_until_recording(bag, ["/joint_states", "/joint_command"])
    assert recorder.status.recording and recorder.status.bag_path == bag
    recorder.annotate("ramp on joint 1")
    start = cell.prepare()
    ramp = cell.ramp(start, "panda_joint1", velocity=0.3, duration_s=2.0)
    ramp.join()
    cell.set_armed(False)
    time.sleep(0.5)
    stopped = recorder.stop()
    return recorder, bag, stopped, [targets["panda_joint1"] for _, targets in ramp.sent]


def test_recorder_client_records_a_session(cell, recorded):
    recorder, bag, stopped, sent = recorded
    assert stopped == bag and not recorder.status.recording
    counts = {t.topic: t.received for t in recorder.status.topics}
    with open_bag(bag) as recording:
        assert {n: recording.topics[n].count for n in ("/joint_states", "/joint_command")} == {
            n: counts[n] for n in ("/joint_states", "/joint_command")}
        assert [a.note for a in recording.session.annotations] == ["ramp on joint 1"]
        commands = recording.joint_states("/joint_command", joints=["panda_joint1"])
    # Every target the ramp sent went through the monitor to /joint_command, plus the
    # monitor's hold as it was disarmed: recorded unchanged and in order, or declared
    # dropped (a loaded host can make the recorder drop; it accounts for each one).
    stats = {t.topic: t for t in recorder.status.topics}["/joint_command"]
    assert stats.received + stats.dropped_estimate == len(sent) + 1, (stats, len(sent))
    ramp_part = commands.position[:-1, 0]
    assert np.isin(ramp_part, sent).all() and np.all(np.diff(ramp_part) > 0)
    assert stats.dropped_estimate > 0 or ramp_part[-1] == sent[-1]

    for call, code in ((lambda: recorder.annotate("idle"), ErrorCode.NOT_READY),
                       (recorder.stop, ErrorCode.NOT_READY),
                       (lambda: recorder.start(profile="nosuch", purpose="trial", split="fit"),
                        ErrorCode.INVALID_ARGUMENT)):
        with pytest.raises(ClientError) as refused:
            call()
        assert refused.value.code == code, str(refused.value)


def test_replay_client_replays_the_session_in_the_twin(cell, recorded):
    bag = recorded[1]
    feedback = []
    result = ReplayClient(cell.probe.node).replay(bag, twin_path=str(cell.twin.path),
                                                  output_dir=str(cell.tmp / "replays"), on_feedback=feedback.append)
    assert Path(result.output_bag).is_dir()
    rmse = dict(zip(result.joint_names, result.joint_rmse_rad))
    # The nominal twin follows a slow ramp to within a few mrad (test_replay.py: 2.9 mrad
    # joint RMSE on a faster tour); joint 1 is the one that moved.
    assert 0.0 < rmse["panda_joint1"] < 0.01, rmse
    # the last feedback, published before the result, can arrive after it (another DDS entity)
    deadline = time.monotonic() + 5.0
    while not (feedback and feedback[-1].progress == pytest.approx(1.0)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert feedback and feedback[-1].progress == pytest.approx(1.0)


def test_ctrl_c_cancels_a_goal(cell, recorded):
    bag = recorded[1]
    client = ReplayClient(cell.probe.node)
    # The Ctrl-C of a command-line user: a KeyboardInterrupt in the thread waiting for the result.
    interrupted = threading.Event()

    def on_feedback(_) -> None:
        if not interrupted.is_set():
            interrupted.set()
            _thread.interrupt_main()
    started = time.monotonic()
    with pytest.raises(GoalCanceled) as cancelled:
        # real time: the ghost replays the run at its own pace, a cancel ends it early
        client.replay(bag, twin_path=str(cell.twin.path), output_dir=str(cell.tmp / "cancelled"), real_time=True,
                      on_feedback=on_feedback)
    assert interrupted.is_set()
    assert cancelled.value.code == ErrorCode.CANCELED
    assert cancelled.value.result is not None and cancelled.value.result.error.code == ErrorCode.CANCELED
    assert time.monotonic() - started < 30.0


def test_a_goal_whose_answers_are_lost_still_runs_to_its_result(cell, recorded):
    """The answer to a goal request (and then to the result request) lost on the way, as a
    fresh command-line process saw once under load (the server's answer writer had not yet
    matched the client; the goal ran to its end while the client waited): the client goes on
    from the server's own status and feedback, and asks for the result again."""
    client = ReplayClient(cell.probe.node)
    action_client = client._client
    lost = {"goal": 1, "result": 1}
    take_data = action_client.take_data

    def take_data_losing_answers():
        data = take_data()
        for kind in lost:
            if kind in data and lost[kind] > 0:
                lost[kind] -= 1
                del data[kind]
        return data
    action_client.take_data = take_data_losing_answers
    result = client.replay(recorded[1], twin_path=str(cell.twin.path), output_dir=str(cell.tmp / "lost"))
    assert lost == {"goal": 0, "result": 0}
    assert 0.0 < dict(zip(result.joint_names, result.joint_rmse_rad))["panda_joint1"] < 0.01
