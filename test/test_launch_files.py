"""The launch files under the real ROS 2 launch system: `ros2 launch` starts each one, every
expected node comes up with the parameters it should have received, every process runs
until shutdown, Ctrl-C stops all of them (nothing is left in the launch's session), and
`ros2 launch -s` lists the arguments. The replay launch replays a bag to the end.

Runs where `launch_ros` is importable and the suite is installed as ROS packages (colcon):
robot_state_publisher and rviz2 must be found in the ament index (RViz is not started:
gui:=false). On the PyPI wheels (no launch) it skips, saying why; test_workspace_files.py
checks the same files by parsing them there.
"""
from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

pytest.importorskip("launch_ros", reason="ROS 2 launch_ros is not importable (the PyPI wheels lack launch)")

from ament_index_python.packages import PackageNotFoundError, get_package_share_directory  # noqa: E402

from twinloop_bringup.node_set import STACK  # noqa: E402
from twinloop_ros.process import fresh_domain_id, localhost_env  # noqa: E402

pytestmark = pytest.mark.ros

STARTUP_S = 150.0  # every node of the stack up, on 2 loaded cores (each imports MuJoCo, torch, ...)
# launch sends SIGTERM to a process still running this long after Ctrl-C (its default, 5 s, is
# exceeded by nine Python nodes shutting down at once on 2 loaded cores); the test then asks
# each node to have exited cleanly on SIGINT, so a slow exit is not mistaken for a crash.
SIGTERM_TIMEOUT_S = 30
SHUTDOWN_S = SIGTERM_TIMEOUT_S + 30.0
REPLAY_S = 120.0


def _missing() -> str | None:
    if shutil.which("ros2") is None:
        return "the ros2 command (ros2cli) is not on PATH"
    for package in ("twinloop_bringup", "twinloop_sim", "robot_state_publisher", "rviz2"):
        try:
            get_package_share_directory(package)
        except PackageNotFoundError:
            return f"package {package} is not in the ament index (build the workspace with colcon and source it)"
    return None


if _missing():
    pytest.skip(_missing(), allow_module_level=True)

SHARE = Path(get_package_share_directory("twinloop_bringup"))


# ------------------------------------------------------------------ what is expected

def composed_description(value: str) -> bool:
    """A URDF with one tree rooted at world holding the Panda (what the emulated workcell publishes)."""
    root = ET.fromstring(value)
    links = {link.get("name") for link in root.findall("link")}
    children = {joint.find("child").get("link") for joint in root.findall("joint")}
    parents = {joint.find("parent").get("link") for joint in root.findall("joint")}
    return links - children == {"world"} and parents <= links and {"panda_link0", "panda_hand"} <= links


def same_file(expected: Path) -> Callable[[str], bool]:
    def check(value: str) -> bool:
        return Path(value).resolve() == expected.resolve()
    check.__name__ = f"the file {expected}"
    return check


STACK_NAMES = [node.name for node in STACK]


def stack(use_sim_time: bool, reset_service: str | None) -> dict[str, dict[str, Any]]:
    """The stack's nodes; `reset_service` None: no simulator resets the scene (the operator does)."""
    expected: dict[str, dict[str, Any]] = {name: {"use_sim_time": use_sim_time} for name in STACK_NAMES}
    expected["policy_runner"]["simulated"] = reset_service is not None
    if reset_service is not None:
        expected["policy_runner"]["reset_service"] = reset_service
    expected["ghost_state_publisher"].update(frame_prefix="ghost/", robot_description=composed_description)
    return expected


@dataclass
class Case:
    launch_file: str
    arguments: list[str]
    nodes: dict[str, dict[str, Any]]  # node name -> {parameter: value, or a predicate of the value}
    absent: tuple[str, ...] = ()  # nodes that must not run
    processes: tuple[str, ...] = ()  # ExecuteProcess names that must run until shutdown
    until_output: str = ""  # wait for this line in the output before stopping
    setup: Callable[[Path], list[str]] | None = field(default=None, repr=False)  # extra arguments


def _twin(tmp: Path) -> Path:
    from twinloop_twin.nominal import build_nominal_twin
    return build_nominal_twin(tmp / "twins", "emulated").path


def _sim_arguments(tmp: Path) -> list[str]:
    return [f"twin_path:={_twin(tmp)}"]


def _isaac_arguments(tmp: Path) -> list[str]:
    # Isaac Sim is not installable here: a stand-in for its python.sh records how it was
    # started and runs until stopped.
    stand_in = tmp / "isaac_python.sh"
    stand_in.write_text(f'#!/bin/sh\necho "$@" > {tmp / "isaac_argv"}\nexec sleep 1000\n')
    stand_in.chmod(0o755)
    return [f"isaac_python:={stand_in}", f"twin_path:={_twin(tmp)}"]


def _replay_arguments(tmp: Path) -> list[str]:
    from twinloop_builder.excitation import JointTrajectory
    from twinloop_builder.synthetic import simulate_session, write_bag
    from twinloop_twin.physics import COMMANDED_JOINTS, load_physics
    from twinloop_twin.workcell import default_config_dir, load_workcell

    workcell = load_workcell()
    t = np.arange(0.0, 2.0, 0.004)
    home = np.array([workcell.home_joint_positions[j] for j in COMMANDED_JOINTS])
    positions = home + 0.1 * np.outer(np.sin(2 * math.pi * 0.5 * t), (np.arange(len(home)) < 7))
    recording = simulate_session(workcell, load_physics(default_config_dir() / "emulated_truth.yaml"),
                                 [JointTrajectory(t, tuple(COMMANDED_JOINTS), positions)], name="launch", seed=1)
    bag = write_bag(recording, tmp / "bag", split="held_out", purpose="trial")
    return [f"bag:={bag}", f"twin_path:={_twin(tmp)}", f"output_dir:={tmp / 'replays'}"]


CASES = {
    "emulated": Case("emulated.launch.py", ["gui:=false"], {
        "emulated_workcell": {"truth_file": same_file(SHARE / "config/emulated_truth.yaml"), "seed": 0},
        **stack(False, "/emulated_workcell/reset")}),
    "emulated_workcell": Case("emulated_workcell.launch.py", ["cameras_enabled:=false", "seed:=3"], {
        "emulated_workcell": {"seed": 3, "cameras_enabled": False}}, absent=("rviz2", "recorder")),
    "stack": Case("stack.launch.py", ["gui:=false"], stack(False, "/emulated_workcell/reset"), absent=("rviz2",)),
    "workcell": Case("workcell.launch.py", ["gui:=false"], {
        "robot_state_publisher": {"robot_description": composed_description}, **stack(False, None)}),
    "sim_mujoco": Case("sim.launch.py", ["gui:=false", "real_time:=true"], {
        "sim_bridge": {"real_time": True, "use_sim_time": False}, **stack(True, "/sim_bridge/reset")},
        setup=_sim_arguments),
    "sim_isaac": Case("sim.launch.py", ["gui:=false", "simulator:=isaac"], stack(True, None), absent=("sim_bridge",),
                      processes=("isaac_twin_bridge",), setup=_isaac_arguments),
    "replay": Case("replay.launch.py", ["gui:=false"], {
        "replay_server": {}, "ghost_state_publisher": {"frame_prefix": "ghost/",
                                                       "robot_description": composed_description}},
        absent=("recorder",), until_output="Goal finished with status: SUCCEEDED", setup=_replay_arguments),
}


# ------------------------------------------------------------------ running a launch file

def _session_processes(sid: int) -> list[str]:
    """Command lines of the processes still in session `sid`."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":  # a zombie has exited already
                command = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"{stat.parent.name}: {command}")
        except (OSError, IndexError, ValueError):
            continue
    return left


def _parameters(session, node: str, names: list[str]) -> dict[str, Any]:
    from rcl_interfaces.srv import GetParameters
    from rclpy.parameter import parameter_value_to_python

    response = session.call(GetParameters, f"/{node}/get_parameters", GetParameters.Request(names=names), 20.0)
    return {name: parameter_value_to_python(value) for name, value in zip(names, response.values)}


@pytest.mark.parametrize("case_name", sorted(CASES))
def test_launch_file_runs(case_name, tmp_path):
    from twinloop_ros.session import RosSession

    case = CASES[case_name]
    arguments = case.arguments + (case.setup(tmp_path) if case.setup else []) + [
        f"sigterm_timeout:={SIGTERM_TIMEOUT_S}"]
    domain = fresh_domain_id()
    log_path = tmp_path / "launch.log"
    with open(log_path, "w") as log:
        launch = subprocess.Popen(["ros2", "launch", "twinloop_bringup", case.launch_file, *arguments],
                                  env=localhost_env(domain), cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    output = lambda: log_path.read_text(errors="replace")  # noqa: E731
    session = RosSession(domain, name="launch_probe")
    try:
        expected = set(case.nodes)
        deadline = time.monotonic() + STARTUP_S
        running: set[str] = set()
        while time.monotonic() < deadline and not expected <= running:
            assert launch.poll() is None, f"ros2 launch exited early ({launch.returncode}):\n{output()}"
            running = {name for name, _ in session.node.get_node_names_and_namespaces()}
            time.sleep(0.5)
        assert expected <= running, f"not up after {STARTUP_S} s: {sorted(expected - running)}\n{output()}"
        assert not set(case.absent) & running, f"should not run: {sorted(set(case.absent) & running)}"
        for node, wanted in case.nodes.items():
            received = _parameters(session, node, sorted(wanted)) if wanted else {}
            for name, value in wanted.items():
                got = received[name]
                ok = value(got) if callable(value) else got == value
                assert ok, f"{node}: parameter {name} is {str(got)[:200]!r}, expected {getattr(value, '__name__', value)!r}"
        if case.until_output:
            deadline = time.monotonic() + REPLAY_S
            while case.until_output not in output() and time.monotonic() < deadline:
                assert "Goal finished with status: ABORTED" not in output(), output()
                time.sleep(0.5)
            assert case.until_output in output(), output()
        if case.launch_file == "sim.launch.py" and "simulator:=isaac" in arguments:
            argv = (tmp_path / "isaac_argv").read_text().split()
            assert argv[:2] == ["-m", "twinloop_sim.isaac_twin_bridge"] and argv[3].endswith("/v0/twin.usda"), argv
        # Every process ran until now: launch reports any that died.
        assert "process has died" not in output(), output()
        for name in case.processes:
            assert f"[{name}-" in output() or f"[INFO] [{name}" in output(), output()
    finally:
        session.close()
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
        try:
            code = launch.wait(timeout=SHUTDOWN_S)
        except subprocess.TimeoutExpired:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
            pytest.fail(f"ros2 launch did not stop within {SHUTDOWN_S} s of Ctrl-C:\n{output()}")
    left = _session_processes(launch.pid)
    if left:
        os.killpg(launch.pid, signal.SIGKILL)
    assert not left, f"left running after ros2 launch stopped: {left}"
    assert code == 0, f"ros2 launch exited with {code}:\n{output()}"
    # Stopped by Ctrl-C, not dead before it, and every node shut down cleanly on it (a
    # stand-in process, or the goal sender, may die of the signal).
    before, _, after = output().partition("user interrupted with ctrl-c (SIGINT)")
    assert "process has died" not in before, output()
    unclean = [line for line in after.splitlines() if "process has died" in line
               and not any(f"[{name}-" in line for name in ("isaac_twin_bridge", "replay_goal"))]
    assert not unclean, "not a clean shutdown on Ctrl-C:\n" + "\n".join(unclean) + "\n" + output()


@pytest.mark.parametrize("launch_file", sorted(p.name for p in (SHARE / "launch").glob("*.launch.py")))
def test_show_arguments(launch_file):
    """`ros2 launch -s` lists every argument the file (and what it includes) declares."""
    import ast

    shown = subprocess.run(["ros2", "launch", "-s", "twinloop_bringup", launch_file], env=localhost_env(0),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    declared = {c.args[0].value for c in ast.walk(ast.parse((SHARE / "launch" / launch_file).read_text()))
                if isinstance(c, ast.Call) and getattr(c.func, "id", None) == "DeclareLaunchArgument"}
    for name in declared:
        assert f"'{name}':" in shown.stdout, f"{launch_file}: -s does not show '{name}':\n{shown.stdout}"
