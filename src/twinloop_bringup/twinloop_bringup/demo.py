"""twinloop demo: a 6 s tour of the emulated workcell through the monitor, recorded and replayed.

1. writes (or verifies) the nominal twin v0 of the emulated workcell,
2. brings up the emulated workcell (MuJoCo with hidden true physics, a stand-in for
   hardware behind the hardware contract), the envelope monitor and the recorder on a
   private localhost-only ROS domain,
3. records a session while driving the arm through a short scripted motion, commanded
   like a policy through the envelope monitor (the only writer of /joint_command),
4. prints what it observed: contract rates, delivery latency, tracking error, what the
   monitor forwarded, what the recorder kept,
5. replays the recorded run in the nominal twin and prints how far its prediction is off.
The whole loop (identification, training, validation, correction) is `twinloop loop`,
which `make demo` runs.
The monitor and the recorder are driven through twinloop_ros.clients, as a user's tool would.

Exit codes: 0 done; 1 the stack did not come up, a node refused, or the monitor stopped
the arm (the message says which, and where the node logs are).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from sensor_msgs.msg import Image, JointState
from twinloop_interfaces.msg import SessionId

from twinloop_twin.motion import demo_motion, period_jitter_ms, rate_hz, tracking_report
from twinloop_sim.replay import format_report, replay_bag
from twinloop_ros.clients import ClientError, EnvelopeClient, RecorderClient
from twinloop_ros.process import NodeProcess, fresh_domain_id
from twinloop_ros.session import RosSession
from twinloop_twin.nominal import ensure_nominal_twin
from twinloop_twin.physics import ARM_JOINTS
from twinloop_twin.workcell import default_config_dir, load_workcell

COMMAND_RATE_HZ = 250.0  # the envelope monitor's nominal command period (config/envelope.yaml)


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--truth-file", default=str(default_config_dir() / "emulated_truth.yaml"),
                        help="hidden physics of the emulated workcell")
    parser.add_argument("--twins", default="twins", help="root folder of twin versions")
    parser.add_argument("--bags", default="bags", help="where the recorded run goes")
    parser.add_argument("--log-dir", default="log/demo", help="where node logs go")
    parser.add_argument("--segment-s", type=float, default=2.0, help="duration of each motion segment")
    args = parser.parse_args(argv)

    workcell = load_workcell()
    twin = ensure_nominal_twin(Path(args.twins), "emulated", progress=say)
    say(f"twin: {twin.workcell} v{twin.version} at {twin.path} ({len(twin.parameters)} parameters)")

    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    domain = fresh_domain_id()
    say(f"starting the emulated workcell (truth: {args.truth_file}), the envelope monitor and the recorder "
        f"on ROS domain {domain}, localhost only")
    config = default_config_dir()
    processes = [
        NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"truth_file": args.truth_file},
                    log_path=log_dir / "emulated_workcell.log"),
        # The watchdogs of config/envelope.yaml (0.5 s, for Python nodes sharing 2 cores with
        # MuJoCo and camera rendering; the demo's own tighter 0.25 s faulted on a loaded host:
        # "no joint state for 251 ms").
        NodeProcess("twinloop_safety.envelope_monitor_node", domain, {},
                    log_path=log_dir / "envelope_monitor.log", extra_args=["--params-file", str(config / "envelope.yaml")]),
        NodeProcess("twinloop_logging.recorder_node", domain, {"output_dir": str(Path(args.bags).resolve())},
                    log_path=log_dir / "recorder.log", extra_args=["--params-file", str(config / "recorder.yaml")]),
    ]
    probe = RosSession(domain, "demo")
    try:
        bag = _run(args, workcell, twin, processes, probe)
    finally:
        probe.close()
        codes = [p.stop() for p in processes]
        say(f"nodes stopped (exit codes {codes}); logs in {log_dir}")
    if bag is None:
        return 1
    _replay_in_twin(bag, twin)
    return 0


def _run(args, workcell, twin, processes: list[NodeProcess], probe: RosSession) -> Path | None:
    states = probe.collect(JointState, "/joint_states", qos=1000, transform=_joint_sample)
    images = {camera: probe.collect(Image, f"/{camera}/color/image_raw", transform=lambda m: _stamp(m.header.stamp))
              for camera in workcell.cameras}
    monitor = EnvelopeClient(probe.node)
    recorder = RecorderClient(probe.node)
    # Principle 5: the demo commands like a policy; only the envelope monitor writes /joint_command.
    command_pub = probe.node.create_publisher(JointState, "/twinloop/policy/command", 100)
    started = time.monotonic()
    try:
        probe.wait_for(lambda: len(states) > 100 and all(images.values()) and monitor.status is not None
                       and command_pub.get_subscription_count() > 0, 60.0, "joint states, images, envelope monitor")
        bag_path = recorder.start(profile="identification", purpose=SessionId.PURPOSE_DEMONSTRATION,
                                  split=SessionId.SPLIT_HELD_OUT,
                                  note="make demo: scripted tour through the envelope monitor",
                                  twin_version=f"{twin.workcell}/v{twin.version}")
        # The recorder subscribes as it discovers the topics: the tour starts once it records the robot's.
        recorder.wait_until_recording(bag_path, ("/joint_states", "/joint_command"), timeout_s=10.0)
        # Armed last, right before the first command: the command watchdog starts with it.
        monitor.arm()
    except TimeoutError as error:
        say(f"ERROR: the workcell stack did not come up ({error}); logs: "
            f"{', '.join(str(p.log_path) for p in processes)}")
        return None
    except ClientError as error:
        say(f"ERROR: {error}")
        return None
    say(f"stack up after {time.monotonic() - started:.1f} s; envelope armed; recording {bag_path}")

    motion = demo_motion(workcell.home_joint_positions, ARM_JOINTS, args.segment_s)
    say(f"driving the arm: {len(motion.waypoints) - 1} minimum-jerk segments, {motion.duration_s:.0f} s, "
        f"commands at {COMMAND_RATE_HZ:.0f} Hz through the envelope monitor")
    window_start = len(states)
    image_start = {camera: len(stamps) for camera, stamps in images.items()}
    commands = _stream(motion, command_pub, probe, args.segment_s)
    # Disarmed as soon as the stream ends, as a policy runner does: a silent stream would
    # trip the command watchdog. The motion ends at rest on its last target.
    try:
        monitor.disarm()
        time.sleep(1.0)
        bag_path = recorder.stop()
    except ClientError as error:
        say(f"ERROR: {error}")
        return None
    _report(states[window_start:], {c: s[image_start[c]:] for c, s in images.items()}, commands, workcell)
    status = monitor.status
    print(f"  envelope monitor: {status.commands_forwarded} commands forwarded, {status.commands_rejected} rejected, "
          f"fault {status.fault} {status.reason}")
    drops = sum(t.dropped_estimate for t in recorder.status.topics)
    print(f"  recorded: {bag_path} ({len(recorder.status.topics)} topics, {drops} messages dropped)")
    if status.fault:
        say(f"ERROR: the envelope monitor stopped the arm ({status.reason}); {status.commands_forwarded} of "
            f"{len(commands)} commands reached the robot. The run is recorded; see {processes[1].log_path}")
        return None
    return Path(bag_path)


def _stream(motion, publisher, probe: RosSession, segment_s: float) -> list:
    # Targets on the ideal command grid (as a policy's own tick counter would), not on the
    # wall time a late tick wakes at: the envelope monitor reads each message as one
    # nominal period, so a jittered grid would look like velocity and acceleration spikes.
    commands = []
    t0 = time.monotonic()
    next_tick = t0
    last_segment = -1
    for k in range(int(motion.duration_s * COMMAND_RATE_HZ) + 1):
        elapsed = k / COMMAND_RATE_HZ
        q = motion.at(elapsed)
        msg = JointState(name=list(ARM_JOINTS), position=q.tolist())
        now = probe.node.get_clock().now()
        msg.header.stamp = now.to_msg()
        publisher.publish(msg)
        commands.append((now.nanoseconds * 1e-9, q))
        segment = int(elapsed // segment_s)
        if segment != last_segment and segment < len(motion.waypoints) - 1:
            say(f"  segment {segment + 1}/{len(motion.waypoints) - 1}")
            last_segment = segment
        next_tick += 1.0 / COMMAND_RATE_HZ
        time.sleep(max(0.0, next_tick - time.monotonic()))
    return commands


def _replay_in_twin(bag: Path, twin) -> None:
    say(f"replaying the recorded run in twin {twin.workcell} v{twin.version} (nominal physics)")
    result, _ = replay_bag(bag, twin.path)
    print()
    print("  " + format_report(result).replace("\n", "\n  "))
    print("  (the twin is nominal: the gap is what identification from recordings has to close)")
    print()


def _report(states, images, commands, workcell) -> None:
    state_t = np.array([s for _, (s, _, _) in states])
    state_q = np.array([q for _, (_, q, _) in states])
    delivery_ms = np.array([(received - s) * 1e3 for _, (s, _, received) in states])
    command_t = np.array([t for t, _ in commands])
    command_q = np.array([q for _, q in commands])
    report = tracking_report(command_t, command_q, state_t, state_q, ARM_JOINTS)
    p50, p99 = period_jitter_ms(state_t)
    d50, d99 = np.percentile(delivery_ms, [50, 99])
    print()
    print("  observed on the hardware contract")
    print(f"    /joint_states            {rate_hz(state_t):7.1f} Hz  (nominal >= 500; stamp period p50 {p50:.2f} ms, p99 {p99:.2f} ms)")
    print(f"    delivery latency           p50 {d50:.2f} ms, p99 {d99:.2f} ms  (stamp to arrival here)")
    for camera, stamps in images.items():
        nominal = workcell.cameras[camera].rate_hz
        print(f"    /{camera}/color   {rate_hz(np.array([s for _, s in stamps])):7.1f} Hz  "
              f"(camera nominal {nominal:.0f} Hz; emulated rate declared 15 Hz on a CPU)")
    print(f"    command -> motion latency  {report.latency_s * 1e3:5.1f} ms  (hidden command delay + servo lag)")
    print("  tracking error, measured vs commanded (rad)")
    for joint in ARM_JOINTS:
        print(f"    {joint:14s} rms {report.rms_rad[joint]:.4f}   max {report.max_rad[joint]:.4f}")
    print()


def _joint_sample(msg: JointState) -> tuple[float, np.ndarray, float]:
    index = [list(msg.name).index(j) for j in ARM_JOINTS]
    return _stamp(msg.header.stamp), np.asarray(msg.position)[index], time.time()


def _stamp(stamp) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


if __name__ == "__main__":
    sys.exit(main())
