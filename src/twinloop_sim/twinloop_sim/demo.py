"""`make demo`: the embedded default, end to end as far as the suite goes today.

1. writes (or verifies) the nominal twin v0 of the emulated workcell,
2. brings up the emulated workcell (MuJoCo with hidden true physics, a stand-in for
   hardware behind the hardware contract) on a private localhost-only ROS domain,
3. drives the arm through a short scripted motion over /joint_command,
4. prints what it observed: contract rates, timer jitter, tracking error and latency.
Later stages (recording, calibration, identification, policy, validation) extend it.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from sensor_msgs.msg import Image, JointState

from twinloop_sim.motion import demo_motion, period_jitter_ms, rate_hz, tracking_report
from twinloop_sim.testing import NodeProcess, RosProbe, fresh_domain_id
from twinloop_twin.nominal import ensure_nominal_twin
from twinloop_twin.physics import ARM_JOINTS
from twinloop_twin.workcell import default_config_dir, load_workcell

COMMAND_RATE_HZ = 100.0


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--truth-file", default=str(default_config_dir() / "emulated_truth.yaml"),
                        help="hidden physics of the emulated workcell")
    parser.add_argument("--twins", default="twins", help="root folder of twin versions")
    parser.add_argument("--log-dir", default="log/demo", help="where node logs go")
    parser.add_argument("--segment-s", type=float, default=2.0, help="duration of each motion segment")
    args = parser.parse_args(argv)

    workcell = load_workcell()
    twin = ensure_nominal_twin(Path(args.twins), "emulated", progress=say)
    say(f"twin: {twin.workcell} v{twin.version} at {twin.path} ({len(twin.parameters)} parameters)")

    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    domain = fresh_domain_id()
    say(f"starting the emulated workcell (truth: {args.truth_file}, ROS domain {domain}, localhost only)")
    process = NodeProcess("twinloop_sim.emulated_workcell_node", domain, {"truth_file": args.truth_file},
                          log_path=log_dir / "emulated_workcell.log")
    probe = RosProbe(domain, "demo")
    try:
        return _run(args, workcell, process, probe)
    finally:
        probe.close()
        code = process.stop()
        say(f"emulated workcell stopped (exit {code}); its log: {process.log_path}")


def _run(args, workcell, process: NodeProcess, probe: RosProbe) -> int:
    states = probe.collect(JointState, "/joint_states", transform=_joint_sample)
    images = {camera: probe.collect(Image, f"/{camera}/color/image_raw", transform=lambda m: _stamp(m.header.stamp))
              for camera in workcell.cameras}
    command_pub = probe.node.create_publisher(JointState, "/joint_command", 10)
    started = time.monotonic()
    try:
        probe.wait_for(lambda: len(states) > 100 and all(images.values())
                       and command_pub.get_subscription_count() > 0, 60.0, "joint states, images, command link")
    except TimeoutError:
        say(f"ERROR: the workcell did not come up; its log says:\n{process.log()}")
        return 1
    say(f"workcell up after {time.monotonic() - started:.1f} s")

    motion = demo_motion(workcell.home_joint_positions, ARM_JOINTS, args.segment_s)
    say(f"driving the arm: {len(motion.waypoints) - 1} minimum-jerk segments, {motion.duration_s:.0f} s, "
        f"commands at {COMMAND_RATE_HZ:.0f} Hz")
    window_start = len(states)
    image_start = {camera: len(stamps) for camera, stamps in images.items()}
    commands = []
    t0 = time.monotonic()
    next_tick = t0
    last_segment = -1
    while (elapsed := time.monotonic() - t0) <= motion.duration_s:
        q = motion.at(elapsed)
        msg = JointState(name=list(ARM_JOINTS), position=q.tolist())
        now = probe.node.get_clock().now()
        msg.header.stamp = now.to_msg()
        command_pub.publish(msg)
        commands.append((now.nanoseconds * 1e-9, q))
        segment = int(elapsed // args.segment_s)
        if segment != last_segment and segment < len(motion.waypoints) - 1:
            say(f"  segment {segment + 1}/{len(motion.waypoints) - 1}")
            last_segment = segment
        next_tick += 1.0 / COMMAND_RATE_HZ
        time.sleep(max(0.0, next_tick - time.monotonic()))
    time.sleep(1.0)

    _report(states[window_start:], {c: s[image_start[c]:] for c, s in images.items()}, commands, workcell)
    return 0


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
