"""Replay of a recorded emulated-workcell run: a twin with the true parameters predicts it
to near the encoder noise, the nominal twin clearly worse; bad inputs are clear errors."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from rclpy.action import ActionClient
from sensor_msgs.msg import JointState
from twinloop_interfaces.action import Replay
from twinloop_interfaces.msg import ErrorCode

from twinloop_logging.bag_writer import BagWriter
from twinloop_logging.typedefs import TypeResolver
from twinloop_twin.motion import demo_motion
from twinloop_sim.replay import ReplayError, load_recorded_run, replay_bag
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id
from twinloop_twin.bundle import TwinError
from twinloop_twin.nominal import build_nominal_twin, build_twin_from_physics
from twinloop_twin.physics import ARM_JOINTS, COMMANDED_JOINTS, load_physics
from twinloop_twin.workcell import default_config_dir, load_workcell

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("twins")
    nominal = build_nominal_twin(root, "emulated")
    truth = build_twin_from_physics(root, "emulated", default_config_dir() / "emulated_truth.yaml",
                                    created_by="test: true physics", source="truth", note="hidden physics",
                                    parent_version=0)
    return {"nominal": nominal.path, "truth": truth.path}


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> Path:
    """A 5 s scripted run of the emulated workcell, recorded by the recorder (trial profile)."""
    tmp = tmp_path_factory.mktemp("run")
    domain = fresh_domain_id()
    workcell = NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"cameras_enabled": False, "seed": 2},
                           log_path=tmp / "workcell.log")
    recorder = NodeProcess("twinloop_logging.recorder_node", domain,
                           {"output_dir": str(tmp / "bags"), "autostart_profile": "trial",
                            "autostart_purpose": "trial", "autostart_split": "held_out",
                            "autostart_session_id": "replay-source"}, log_path=tmp / "recorder.log")
    probe = RosProbe(domain)
    try:
        states = probe.collect(JointState, "/joint_states")
        publisher = probe.node.create_publisher(JointState, "/joint_command", 10)
        probe.wait_for(lambda: len(states) > 100 and publisher.get_subscription_count() >= 2, 30.0,
                       "workcell and recorder")
        time.sleep(1.0)  # the recorder subscribes to topics as it discovers them
        motion = demo_motion(load_workcell().home_joint_positions, ARM_JOINTS, segment_s=1.2)
        t0 = time.monotonic()
        while (elapsed := time.monotonic() - t0) <= motion.duration_s:
            msg = JointState(name=list(ARM_JOINTS), position=motion.at(elapsed).tolist())
            msg.header.stamp = probe.node.get_clock().now().to_msg()
            publisher.publish(msg)
            time.sleep(0.01)
        time.sleep(0.8)
    finally:
        probe.close()
        assert recorder.stop() == 0, recorder.log()
        workcell.stop()
    bags = [p for p in (tmp / "bags").iterdir() if p.is_dir()]
    assert len(bags) == 1, recorder.log()
    _assert_recorded_in_time(bags[0])
    return bags[0]


def _assert_recorded_in_time(bag: Path) -> None:
    """Replay judges the twin by command timing; a host too loaded to deliver commands in
    time makes the recording, not the twin, wrong. Say so instead of blaming the twin."""
    from twinloop_logging.bag_reader import open_bag
    with open_bag(bag) as opened:
        delays = np.array([(m.log_time_ns - (m.msg.header.stamp.sec * 10**9 + m.msg.header.stamp.nanosec)) * 1e-6
                           for m in opened.messages(["/joint_command"])])
    assert np.percentile(delays, 99) < 10.0, (
        f"commands reached the recorder up to {delays.max():.0f} ms late (p99 {np.percentile(delays, 99):.1f} ms): "
        "the host was overloaded while recording; rerun on an idle machine")


def test_true_twin_predicts_the_run_and_the_nominal_twin_does_not(recorded_run, twins):
    truth, _ = replay_bag(recorded_run, twins["truth"])
    nominal, _ = replay_bag(recorded_run, twins["nominal"])
    noise = load_physics(default_config_dir() / "emulated_truth.yaml").noise.joint_position_std_rad
    print(f"RMSE truth twin {truth.joint_rmse_rad.max() * 1e3:.3f} mrad, nominal {nominal.joint_rmse_rad.max() * 1e3:.3f}"
          f" mrad; EE {truth.end_effector_rmse_m * 1e3:.2f} vs {nominal.end_effector_rmse_m * 1e3:.2f} mm; "
          f"alignment {truth.time_offset_s * 1e3:.0f} vs {nominal.time_offset_s * 1e3:.0f} ms")
    arm = [truth.joint_names.index(j) for j in ARM_JOINTS]
    # Near the encoder noise (0.05 mrad): the rest is the recorder's receive time standing
    # in for the workcell's (same host, < 1 ms) and the 2 ms physics tick.
    assert truth.joint_rmse_rad[arm].max() < 20 * noise
    assert nominal.joint_rmse_rad[arm].max() > 3 * truth.joint_rmse_rad[arm].max()
    assert abs(truth.time_offset_s) <= 0.002
    # the nominal twin's shorter command delay shows as a lead of its motion
    assert nominal.time_offset_s < truth.time_offset_s
    assert truth.end_effector_rmse_m < 1e-3
    assert np.isfinite(truth.box_final_position_error_m) and truth.box_final_position_error_m < 0.005


def test_replay_action_reports_the_same_numbers_and_drives_the_ghost(recorded_run, twins, tmp_path):
    domain = fresh_domain_id()
    server = NodeProcess("twinloop_sim.replay_node", domain, {"output_dir": str(tmp_path / "replays")},
                         log_path=tmp_path / "replay.log")
    probe = RosProbe(domain)
    try:
        ghost = probe.collect(JointState, "/twinloop/sim/joint_states", qos=1000)
        client = ActionClient(probe.node, Replay, "/replay_server/replay")
        assert client.wait_for_server(timeout_sec=30.0), server.log()
        feedback = []
        goal = client.send_goal_async(Replay.Goal(bag_path=str(recorded_run), twin_path=str(twins["truth"])),
                                      feedback_callback=lambda f: feedback.append(f.feedback.status))
        probe.wait_for(goal.done, 10.0, "goal accepted")
        result_future = goal.result().get_result_async()
        probe.wait_for(result_future.done, 120.0, "replay result")
        result = result_future.result().result
    finally:
        probe.close()
        server.stop()
    assert result.error.code == ErrorCode.NONE, result.error.message
    expected, _ = replay_bag(recorded_run, twins["truth"])
    np.testing.assert_allclose(result.joint_rmse_rad, expected.joint_rmse_rad, rtol=1e-9)
    # the ghost is published in a burst when not real time; a Python reader keeps a part of it
    assert Path(result.output_bag).is_dir() and feedback and len(ghost) >= 20
    from twinloop_logging.bag_reader import open_bag
    with open_bag(result.output_bag) as bag:
        replayed = bag.joint_states("/twinloop/sim/joint_states")
        assert replayed.position.shape[1] == len(expected.joint_names)


def _bag_with_commands(path: Path, names: list[str]) -> Path:
    resolver = TypeResolver()
    store = resolver.typestore
    JointState_, Header, Time = (store.types[t] for t in ("sensor_msgs/msg/JointState", "std_msgs/msg/Header",
                                                          "builtin_interfaces/msg/Time"))
    writer = BagWriter(path)
    for topic in ("/joint_states", "/joint_command"):
        writer.add_topic(topic, resolver.definition("sensor_msgs/msg/JointState"))
    home = load_workcell().home_joint_positions
    for k in range(50):
        stamp = 1_000_000_000 + k * 2_000_000
        header = Header(stamp=Time(sec=stamp // 10**9, nanosec=stamp % 10**9), frame_id="")
        state = JointState_(header=header, name=list(home), position=np.array(list(home.values())),
                            velocity=np.zeros(0), effort=np.zeros(0))
        writer.write("/joint_states", store.serialize_cdr(state, "sensor_msgs/msg/JointState"), stamp)
        if names and k == 10:
            command = JointState_(header=header, name=names, position=np.zeros(len(names)),
                                  velocity=np.zeros(0), effort=np.zeros(0))
            writer.write("/joint_command", store.serialize_cdr(command, "sensor_msgs/msg/JointState"), stamp)
    writer.close()
    return path


def test_bag_without_commands_is_a_clear_error(tmp_path, twins):
    bag = _bag_with_commands(tmp_path / "no_commands", [])
    with pytest.raises(ReplayError, match="no /joint_command messages"):
        replay_bag(bag, twins["nominal"])


def test_commands_with_foreign_joint_names_are_a_clear_error(tmp_path):
    bag = _bag_with_commands(tmp_path / "ur5", ["shoulder_pan_joint", "elbow_joint"])
    with pytest.raises(ReplayError, match="shoulder_pan_joint"):
        load_recorded_run(bag, list(COMMANDED_JOINTS))


def test_bad_twin_path_is_a_clear_error(tmp_path):
    bag = _bag_with_commands(tmp_path / "ok", ["panda_joint1"])
    with pytest.raises((TwinError, FileNotFoundError), match="v9"):
        replay_bag(bag, tmp_path / "twins/emulated/v9")


def test_replay_command_as_the_readme_writes_it_leaves_the_response_bag_in_replays(tmp_path, twins):
    """`twinloop replay BAG --twin T` (no --output-dir): the response bag goes to replays/
    of the working directory, as the replay server's does; again it refuses to overwrite it;
    --report-only writes nothing."""
    import subprocess
    import sys
    twinloop = str(Path(sys.executable).with_name("twinloop"))
    bag = _bag_with_commands(tmp_path / "run", ["panda_joint1"])
    work = tmp_path / "work"
    work.mkdir()

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([twinloop, "replay", str(bag), "--twin", str(twins["nominal"]), *extra], cwd=work,
                              capture_output=True, text=True, timeout=120)

    done = run()
    assert done.returncode == 0, done.stderr
    response = work / "replays" / "run-replay-v0"
    assert f"twin response: {Path('replays') / 'run-replay-v0'}" in done.stdout
    expected, _ = replay_bag(bag, twins["nominal"])
    from twinloop_logging.bag_reader import open_bag
    with open_bag(response) as opened:
        replayed = opened.joint_states("/twinloop/sim/joint_states")
    assert len(replayed.stamps_ns) == len(expected.twin_t)
    np.testing.assert_allclose(replayed.position, expected.twin_q, atol=1e-9)
    written = sorted(p.relative_to(work).as_posix() for p in work.rglob("*"))

    again = run()
    assert again.returncode == 2
    (line,) = again.stderr.splitlines()
    assert line.startswith("twinloop replay: error: replays/run-replay-v0 exists already")
    report_only = run("--report-only")
    assert report_only.returncode == 0, report_only.stderr
    assert "twin response" not in report_only.stdout and "end-effector RMSE" in report_only.stdout
    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*")) == written
