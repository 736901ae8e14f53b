"""The policy runner over DDS: refuses mismatched policies, runs recorded trials through the
envelope monitor on the emulated workcell, and a killed runner leaves the robot held."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from sensor_msgs.msg import JointState
from twinloop_interfaces.msg import EnvelopeStatus, ErrorCode

from twinloop_policy.scripted import write_scripted_policy
from twinloop_ros.testing import RELIABLE, EnvelopeCell, stamp_s
from twinloop_ros.testing import NodeProcess, fresh_domain_id
from twinloop_twin.workcell import load_workcell

pytestmark = pytest.mark.ros

RUNNER = "twinloop_policy.policy_runner_node"
TIMEOUT_S = 0.5  # the monitor's command watchdog, generous for a shared 2-core host
# Its joint-state watchdog: nothing here tests it, and at 0.5 s a CI run beside other load
# saw the workcell's stream pause 502 ms and fault STALE_JOINT_STATE before the killed
# runner's STALE_COMMAND could come.
JOINT_STATE_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def home():
    return load_workcell().home_arm_positions


def _refused(tmp_path, folder, **parameters) -> str:
    process = NodeProcess(RUNNER, fresh_domain_id(), {"policy_path": str(folder), **parameters},
                          log_path=tmp_path / "runner.log")
    code = process.process.wait(timeout=60)
    log = process.log()
    process.stop()
    assert code == 2, log
    return log


def test_runner_refuses_a_mismatched_policy(tmp_path, home):
    wrong_size = write_scripted_policy(tmp_path / "size", home, observation_size=6)
    log = _refused(tmp_path, wrong_size.folder)
    assert "declares size 6 but lists 7 joints" in log
    wrong_names = write_scripted_policy(tmp_path / "names", home, joints=[f"joint_a{i}" for i in range(1, 8)])
    log = _refused(tmp_path, wrong_names.folder)
    assert "joint_a1" in log and "not commandable" in log
    too_fast = write_scripted_policy(tmp_path / "rate", home, rate_hz=1000.0)
    assert "faster than the robot's joint states" in _refused(tmp_path, too_fast.folder)


@pytest.mark.parametrize("name, value, says", [
    ("stale_abort_s", float("nan"), "> 0"), ("stale_abort_s", -1.0, "> 0"), ("settle_s", float("nan"), ">= 0"),
    ("settle_s", -0.5, ">= 0"), ("observation_timeout_s", 0.0, "> 0"), ("record_ready_timeout_s", float("inf"), "> 0"),
    ("judge_wait_s", float("nan"), ">= 0"), ("judge_settle_m", 0.0, "> 0"),
])
def test_runner_refuses_a_wait_that_is_not_a_time(tmp_path, home, name, value, says):
    policy = write_scripted_policy(tmp_path / "reach", home)
    log = _refused(tmp_path, policy.folder, **{name: value})
    what = "distance" if name.endswith("_m") else "time"
    assert f"{name} {value}: give a finite {what} {says}" in log and "Traceback" not in log, log


@pytest.fixture(scope="module")
def module_cell(tmp_path_factory):
    logs = tmp_path_factory.mktemp("runner")
    cell = EnvelopeCell(logs, {"command_timeout_s": TIMEOUT_S, "joint_state_timeout_s": JOINT_STATE_TIMEOUT_S})
    cell.logs = logs
    yield cell
    cell.close()


@pytest.fixture
def cell(module_cell):
    """The module's cell; the recorder and runner a test starts are stopped after it, also when
    it failed (left running, they answered the next test's trials in place of its own)."""
    yield module_cell
    module_cell.stop_extra()


def test_runs_n_recorded_trials_through_the_monitor(cell, home, tmp_path):
    bags = tmp_path / "bags"
    goal = [home[0] + 0.15, home[1] + 0.1] + home[2:]
    # max_age 50 ms: other tests share the 2 cores and delay joint states now and then.
    policy = write_scripted_policy(tmp_path / "reach", goal, rate_hz=250.0, timeout_s=10.0, max_age_s=0.05)
    # the recorder's own default, relative to where it runs: the outcomes must name the bags absolutely
    recorder = NodeProcess("twinloop_logging.recorder_node", cell.domain_id, {"output_dir": "bags"},
                           log_path=cell.logs / "recorder.log", cwd=tmp_path)
    runner = NodeProcess(RUNNER, cell.domain_id, {"twin_version": "emulated/v0", "settle_s": 0.3},
                         log_path=cell.logs / "runner.log")
    cell.extra += [recorder, runner]
    policy_commands = cell.probe.collect(JointState, "/twinloop/policy/command", RELIABLE)
    reset_commands = cell.probe.collect(JointState, "/twinloop/planning/command", RELIABLE)
    feedback = []
    result = cell.run_trials(str(policy.folder), num_trials=2, feedback=feedback.append, runner_log=runner.log)
    assert result.error.code == ErrorCode.NONE, result.error.message + runner.log()
    assert [o.trial_index for o in result.outcomes] == [0, 1]
    for outcome in result.outcomes:
        assert outcome.success, outcome.reason
        assert outcome.reason == "goal reached"
        # 0.15 rad at <= 0.5 rad/s with 2 rad/s^2 ramps: ~1.5 s of motion.
        assert 0.8 < outcome.duration_s < 6.0
    assert {"resetting", "recording", "running"} <= {f.feedback.status for f in feedback}

    # Each trial is its own bag with the session metadata of a held-out trial.
    from twinloop_logging.bag_reader import Bag
    paths = [o.bag_path for o in result.outcomes]
    assert len(set(paths)) == 2
    assert all(Path(p).is_absolute() and Path(p).parent == bags and Path(p).is_dir() for p in paths), paths
    for index, path in enumerate(paths):
        bag = Bag(path)
        session = bag.session
        assert (session.purpose, session.split, session.trial_index) == ("trial", "held_out", index)
        assert session.policy_version == "scripted_reach@1" and session.twin_version == "emulated/v0"
        stats = bag.topic_stats
        assert {"/joint_states", "/joint_command", "/twinloop/policy/command"} <= set(stats), sorted(stats)
        # The whole trial is in the bag: >= 0.8 s of joint states at 500 Hz, every command.
        assert stats["/joint_states"]["received"] > 400, stats["/joint_states"]
        assert stats["/joint_command"]["received"] > 200 and stats["/twinloop/policy/command"]["received"] > 200

    # Everything the policy sent came out of the monitor unchanged (same stamps, same targets).
    out = {stamp_s(m.header.stamp): list(m.position) for _, m in cell.hardware_commands
           if m.header.frame_id == ""}
    sent_cmds = [(stamp_s(m.header.stamp), list(m.position)) for _, m in policy_commands]
    assert len(sent_cmds) > 300
    assert all(out.get(t) == p for t, p in sent_cmds), "a policy command was changed or dropped by the monitor"
    # The second trial's reset brought the arm home from the first one's goal along a planned
    # path (planned_reset, the runner's default), every command of it forwarded unchanged.
    log = runner.log()
    assert "trial 1: reset move to the start pose on the straight line" in log, log
    reset_sent = [(stamp_s(m.header.stamp), list(m.position)) for _, m in reset_commands]
    # trial 1's reset: from the first command at trial 0's goal (holds until the monitor is
    # armed: not forwarded) to the first that leaves it, then the move home
    at_goal = next(i for i, (_, p) in enumerate(reset_sent) if abs(p[0] - goal[0]) < 0.02)  # where trial 0 ended
    leaving = next(i for i in range(at_goal, len(reset_sent)) if reset_sent[i][1] != reset_sent[at_goal][1])
    assert len(reset_sent) - leaving > 100 and abs(reset_sent[-1][1][0] - home[0]) < 1e-6, len(reset_sent)
    assert all(out.get(t) == p for t, p in reset_sent[leaving:]), "a reset command was changed or dropped"
    assert cell.latest_status().state == EnvelopeStatus.STATE_DISARMED
    # Where the last trial left the arm: within the policy's goal tolerance (0.01 rad) when it
    # ended, then held by the disarmed monitor at a measured position that lags by a joint
    # state and the tracking error (a fresh-clone run measured 0.01006 rad): 0.015 rad.
    final = cell.measured()
    assert abs(final["panda_joint1"] - goal[0]) < 0.015 and abs(final["panda_joint2"] - goal[1]) < 0.015


def test_trial_is_not_run_while_the_recorder_lacks_a_required_topic(cell, home, tmp_path):
    cell.reset_fault()
    cell.set_armed(False)
    recorder = NodeProcess("twinloop_logging.recorder_node", cell.domain_id, {"output_dir": str(tmp_path / "bags")},
                           log_path=cell.logs / "recorder-missing.log")
    runner = NodeProcess(RUNNER, cell.domain_id, {"record_required_topics": ["/joint_states", "/no_such_topic"],
                                                  "record_ready_timeout_s": 1.0, "settle_s": 0.1},
                         log_path=cell.logs / "runner-missing.log")
    cell.extra += [recorder, runner]
    policy = write_scripted_policy(tmp_path / "reach", [home[0] + 0.15] + home[1:], timeout_s=10.0, max_age_s=0.05)
    policy_commands = cell.probe.collect(JointState, "/twinloop/policy/command", RELIABLE)
    error = cell.run_trials(str(policy.folder), timeout_s=30.0, runner_log=runner.log).error
    assert error.code == ErrorCode.NOT_READY, error.message
    # the missing topic is named (a fresh-clone run also listed /joint_states: the recorder had
    # not discovered its publisher within the 1 s given here on a loaded host)
    assert "'/no_such_topic']" in error.message and "not run" in error.message
    assert policy_commands == [], "the policy ran although its trial could not be recorded"
    # The bag that was started is closed, not lost, and says what it never saw.
    from twinloop_logging.bag_reader import Bag
    bag_path = error.message.rsplit("bag kept: ", 1)[1].rstrip(")")
    if "'/joint_states'" not in error.message:
        assert "/joint_states" in Bag(bag_path).topic_stats
    assert abs(cell.measured()["panda_joint1"] - home[0]) < 0.01


def test_killed_runner_leaves_the_robot_held(cell, home, tmp_path):
    cell.reset_fault()
    cell.set_armed(False)
    cell.reset_workcell()
    # A long reach (joint 7, no Cartesian limit near): killed mid-motion.
    policy = write_scripted_policy(tmp_path / "long", home[:6] + [home[6] + 1.5], timeout_s=30.0, max_age_s=0.05)
    runner = NodeProcess(RUNNER, cell.domain_id, {"policy_path": str(policy.folder), "autostart": True},
                         log_path=cell.logs / "runner-killed.log")
    cell.extra.append(runner)
    cell.probe.wait_for(lambda: cell.measured()["panda_joint7"] > home[6] + 0.3, 60.0, "the policy moving joint 7")
    runner.process.send_signal(signal.SIGKILL)  # no clean shutdown: the stream just stops
    killed_at = time.time()
    status = cell.wait_for_fault(5.0)
    assert status.fault == EnvelopeStatus.FAULT_STALE_COMMAND, status.reason
    hold = cell.holds_after(killed_at - 0.05)[0]
    reaction = stamp_s(hold.header.stamp) - killed_at
    assert reaction < TIMEOUT_S + 0.1, reaction
    time.sleep(1.0)
    held = dict(zip(hold.name, hold.position))["panda_joint7"]
    assert abs(cell.measured()["panda_joint7"] - held) < 3e-3
    assert held < home[6] + 1.2, "the robot should have stopped well short of the goal"


def test_readme_run_block_as_written_and_a_goal_without_the_stack(tmp_path):
    """The policy README's Run block, its lines as written (the policy folder in this test's
    folder instead of /tmp/reach; `tools/in_env.sh X` is the venv's X): the scripted policy
    written, the runner up on config/policy_runner.yaml; then, as that README says, a goal
    sent to the runner alone (no monitor, recorder or reset service) fails with one line
    naming the monitor, exit 3, and the runner stays up."""
    import subprocess
    import sys

    from twinloop_ros.process import interrupt_group, localhost_env

    readme = (Path(__file__).resolve().parents[1] / "src" / "twinloop_policy" / "README.md").read_text()
    block = readme.split("## Run", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith("tools/in_env.sh ")]
    assert len(lines) == 2 and "policy scripted /tmp/reach" in lines[0] and "policy_runner" in lines[1], lines
    assert "`twinloop trials run /tmp/reach -n 1` exits 3" in " ".join(readme.split())
    root, bin_dir = Path(__file__).resolve().parents[1], Path(sys.executable).parent
    folder = tmp_path / "reach"

    def argv(line: str) -> list[str]:
        words = line.replace("/tmp/reach", str(folder)).split()[1:]  # tools/in_env.sh dropped
        return [str(bin_dir / words[0]), *words[1:]]

    env = localhost_env(fresh_domain_id())
    written = subprocess.run(argv(lines[0]), cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0 and (folder / "policy.yaml").is_file(), written.stderr
    policy_yaml = (folder / "policy.yaml").read_text()
    again = subprocess.run(argv(lines[0]), cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "exists" in again.stderr, again.stderr  # a new folder, as the README says
    assert (folder / "policy.yaml").read_text() == policy_yaml
    log = open(tmp_path / "runner.log", "w")
    runner = subprocess.Popen(argv(lines[1]), cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "policy runner up" not in (tmp_path / "runner.log").read_text():
            assert time.monotonic() < deadline and runner.poll() is None, (tmp_path / "runner.log").read_text()
            time.sleep(0.5)
        goal = subprocess.run(argv(f"tools/in_env.sh twinloop trials run {folder} -n 1"), cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        errors = [line for line in goal.stderr.splitlines() if "error" in line]
        print(goal.stderr)
        assert goal.returncode == 3 and len(errors) == 1 and "Traceback" not in goal.stderr, goal.stderr
        assert "service /envelope_monitor/set_armed is not available: start the envelope monitor" in errors[0], errors
        assert runner.poll() is None, "the runner should stay up after a goal it could not run"
    finally:
        interrupt_group(runner)
        log.close()
    assert "Traceback" not in (tmp_path / "runner.log").read_text()
