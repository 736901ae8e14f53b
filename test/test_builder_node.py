"""End to end over real DDS: excite the emulated workcell while the recorder records, then
build a twin through the twin_builder node's ~/build action and check it against the
emulated workcell's hidden truth (config/emulated_truth.yaml).

Processes: emulated workcell (cameras off), recorder, twin builder, each a subprocess on
one private localhost domain; the test plays the excitation from its own probe node.
Recordings are short (4 s fit, 3 s held-out) to keep the suite fast. Commands reach the
workcell through DDS with milliseconds of jitter on a loaded host; the builder times them by
the workcell's own /twinloop/emulated_workcell/applied_command stamps (physics clock), so the
issue's goals (gains within 5 %, delay within 1 ms) hold here too.
"""
from __future__ import annotations

import time

import pytest
from rclpy.action import ActionClient
from twinloop_interfaces.action import BuildTwin
from twinloop_interfaces.msg import ErrorCode
from sensor_msgs.msg import JointState

from twinloop_builder.excitation import JointExcitationConfig, joint_excitation
from twinloop_builder.player_node import ExcitationPlayer, IdentificationRecorder
from twinloop_ros.testing import NodeProcess, RosProbe, fresh_domain_id
from twinloop_twin.bundle import list_versions, load_twin_version
from twinloop_twin.nominal import build_nominal_twin, physics_parameters
from twinloop_twin.physics import ARM_JOINTS, load_physics
from twinloop_twin.scene import acting_command_delay, compile_workcell
from twinloop_twin.workcell import default_config_dir, load_workcell

pytestmark = pytest.mark.ros
AMPLITUDE = {**{j: 0.4 for j in ARM_JOINTS}, "panda_finger_joint1": 0.0}


@pytest.fixture(scope="module")
def cell(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("builder")
    build_nominal_twin(tmp / "twins", "emulated")
    domain = fresh_domain_id()
    processes = [
        NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"cameras_enabled": False, "seed": 5},
                    log_path=tmp / "workcell.log"),
        NodeProcess("twinloop_logging.recorder_node", domain, {"output_dir": str(tmp / "bags")},
                    log_path=tmp / "recorder.log"),
        NodeProcess("twinloop_builder.twin_builder_node", domain, {"twins_root": str(tmp / "twins")},
                    log_path=tmp / "builder.log"),
    ]
    probe = RosProbe(domain)
    states = probe.collect(JointState, "/joint_states")
    try:
        probe.wait_for(lambda: len(states) > 50, 30.0, "joint states")
    except TimeoutError:
        probe.close()
        for p in processes:
            p.stop()
        raise AssertionError("workcell did not start:\n" + processes[0].log())
    workcell = load_workcell()
    model = compile_workcell(workcell, load_physics(default_config_dir() / "nominal_physics.yaml"))
    # No envelope monitor in this cell: the test stands in for it and writes /joint_command.
    player, recorder = ExcitationPlayer(probe.node, command_topic="/joint_command"), IdentificationRecorder(probe.node)
    bags = {}
    for split, duration, seed in (("fit", 4.0, 0), ("held_out", 3.0, 7)):
        trajectory = joint_excitation(JointExcitationConfig(duration_s=duration, ramp_s=1.0, amplitude=AMPLITUDE,
                                                            seed=seed),
                                      workcell.home_joint_positions, model, workcell.urdf_xml,
                                      workcell.table_top_height_m)
        bags[split] = recorder.start(split=split, output_dir=str(tmp / "bags"))  # returns once it records
        time.sleep(1.0)  # a second at rest before the motion, as `twinloop build excite` records
        player.play(trajectory)
        time.sleep(0.5)
        recorder.stop()
    client = ActionClient(probe.node, BuildTwin, "/twin_builder/build")
    assert client.wait_for_server(timeout_sec=30.0), processes[2].log()
    yield {"tmp": tmp, "probe": probe, "client": client, "bags": bags, "processes": processes}
    client.destroy()
    probe.close()
    for p in processes:
        p.stop()


def run_goal(cell, timeout_s: float, **fields) -> tuple:
    feedback = []
    goal = BuildTwin.Goal(workcell="emulated", parent_version=-1, **fields)
    future = cell["client"].send_goal_async(goal, feedback_callback=lambda msg: feedback.append(msg.feedback))
    deadline = time.monotonic() + 30.0
    while not future.done() and time.monotonic() < deadline:
        time.sleep(0.05)
    handle = future.result()
    assert handle.accepted
    result_future = handle.get_result_async()
    deadline = time.monotonic() + timeout_s
    while not result_future.done() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert result_future.done(), f"no result in {timeout_s} s:\n{cell['processes'][2].log()[-3000:]}"
    # Feedback and result travel on different DDS entities: the last feedback, published
    # before the result, can arrive after it.
    deadline = time.monotonic() + 5.0
    while result_future.result().result.error.code == ErrorCode.NONE and time.monotonic() < deadline and not (
            feedback and feedback[-1].stage == "done"):
        time.sleep(0.05)
    return result_future.result().result, feedback


def test_held_out_bag_as_fit_data_is_refused(cell):
    result, _ = run_goal(cell, 60.0, fit_bags=[cell["bags"]["held_out"]], held_out_bags=[cell["bags"]["fit"]])
    assert result.error.code == ErrorCode.WRONG_SPLIT, result.error.message
    assert "never fit" in result.error.message
    assert list_versions(cell["tmp"] / "twins", "emulated") == [0]  # nothing written


def test_build_action_identifies_the_emulated_workcell(cell):
    started = time.monotonic()
    result, feedback = run_goal(cell, 900.0, fit_bags=[cell["bags"]["fit"]], held_out_bags=[cell["bags"]["held_out"]])
    assert result.error.code == ErrorCode.NONE, result.error.message
    assert result.version == 1
    assert feedback and feedback[-1].stage == "done" and {f.stage for f in feedback} >= {"reading", "arm"}
    overall = [f.progress for f in feedback]  # of the whole build: it never goes back
    assert overall[-1] == 1.0 and all(b >= a for a, b in zip(overall, overall[1:])), overall
    ratio = result.held_out_rmse_after / result.held_out_rmse_before
    twin = load_twin_version(cell["tmp"] / "twins", "emulated", 1)
    truth = physics_parameters(load_physics(default_config_dir() / "emulated_truth.yaml"), source="t").means()
    delay = twin.parameters["command.delay_s"]
    gains = {n: p for n, p in twin.parameters.items() if n.startswith("actuator.panda_joint") and p.identifiable}
    errors = {n: p.mean / truth[n] - 1 for n, p in gains.items()}
    print(f"\nbuild {time.monotonic() - started:.0f} s; held-out RMSE {result.held_out_rmse_before * 1e3:.3f} -> "
          f"{result.held_out_rmse_after * 1e3:.3f} mrad (ratio {ratio:.3f}); delay {delay.mean * 1e3:.2f} ms, acting as "
          f"{acting_command_delay(delay.mean) * 1e3:.0f} ms (truth {truth['command.delay_s'] * 1e3:.1f}); worst gain error "
          f"{max(errors.items(), key=lambda e: abs(e[1])) if errors else None}; "
          f"not identifiable: {len(result.not_identifiable)}")
    assert ratio <= 0.3
    # Seen on 8 s (idle and loaded host): delay 8.00 ms, every arm parameter identifiable, worst
    # error 1.2 % (armature of joint 5), gains within 0.4 %, none beyond 2 sigma of the truth;
    # on 4 s (loaded host): the same, worst error 1.9 % (armature of joint 6, 1.6 sigma).
    assert delay.identifiable, delay
    assert abs(delay.mean - truth["command.delay_s"]) <= 0.001, delay
    assert acting_command_delay(delay.mean) == pytest.approx(acting_command_delay(truth["command.delay_s"])), delay
    assert len(gains) == 2 * len(ARM_JOINTS), sorted(gains)
    assert all(abs(e) <= 0.05 for e in errors.values()), errors
    identified = {n: p for n, p in twin.parameters.items() if p.identifiable}
    z = sorted(((p.mean - truth[n]) / p.std, p.mean / truth[n] - 1, n) for n, p in identified.items())
    print("largest deviations (sigma, relative):", [(n, round(zz, 1), f"{r:+.2%}") for zz, r, n in
                                                     sorted(z, key=lambda e: -abs(e[0]))[:6]])
    assert len(identified) == 5 * len(ARM_JOINTS) + 1, sorted(set(twin.parameters) - set(identified))
    for name, p in identified.items():
        # The intervals are calibrated over drawn truths to a z RMS of 1.14, largest |z| 5.5,
        # armature the least calibrated (bench/uncertainty_calibration.py): over 36 parameters,
        # one beyond 3 sigma is expected about one run in four. Seen in a fresh-clone run:
        # joint 7's armature at -1.56 % (-3.8 sigma). So each within 3 sigma, or within 2 % and
        # 5 sigma.
        deviation, relative = abs(p.mean - truth[name]), abs(p.mean / truth[name] - 1)
        assert deviation <= 3 * p.std or (relative <= 0.02 and deviation <= 5 * p.std), \
            (name, p.mean, p.std, truth[name])
        # goal 5 %: gains and damping (the delay's goals, above: within 1 ms and its acting step
        # exact; it is reported as that step's middle, 0.5 ms or 6 % below the 8 ms truth)
        if name.startswith("actuator.") or name.endswith(".damping"):
            assert abs(p.mean / truth[name] - 1) <= 0.05, (name, p.mean, truth[name])
    assert [b.split for b in twin.manifest.provenance.source_bags] == ["fit", "held_out"]


def test_the_newest_versions_standing_on_diagnostics_and_rviz(cell):
    """A validation round's verdict (twinloop_twin.status) reaches /diagnostics (WARN when
    stale, with the evidence) and the RViz text marker on /twin_builder/twin_status."""
    from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
    from twinloop_ros.qos import LATCHED
    from twinloop_twin.bundle import latest_version
    from twinloop_twin.status import record_verdict
    from visualization_msgs.msg import MarkerArray

    probe, root = cell["probe"], cell["tmp"] / "twins"
    version = latest_version(root, "emulated")
    diagnostics = probe.collect(DiagnosticArray, "/diagnostics")
    markers = probe.collect(MarkerArray, "/twin_builder/twin_status", LATCHED)
    for stale, level, word in ((True, DiagnosticStatus.WARN, "STALE"), (False, DiagnosticStatus.OK, "current")):
        record_verdict(root / "emulated" / f"v{version}", stale, f"median z {9.0 if stale else 0.4}", "round.json")
        since = len(diagnostics), len(markers)

        def seen() -> bool:
            twin = [s for _, a in diagnostics[since[0]:] for s in a.status if s.name == "twinloop twin emulated"]
            text = [m.text for _, a in markers[since[1]:] for m in a.markers]
            return any(s.level == level and word in s.message for s in twin) and any(word in t for t in text)
        probe.wait_for(seen, 15.0, f"the twin's standing {word} on /diagnostics and ~/twin_status")
    status = [s for _, a in diagnostics for s in a.status if s.name == "twinloop twin emulated"][-1]
    assert status.message.startswith(f"v{version} current (checked ") and "median z 0.4" in status.message
    assert {k.key: k.value for k in status.values}["round"] == "round.json"
