"""Command streams and their gaps in the envelope's pure core: a stream is read as steps at
the nominal period, referenced to its previous target whatever the arrival gap; silence is
judged by the watchdog at each tick's due time; targets at or beyond a position limit.

Time is the monitor's handling time (s). The robot is simulated as measured = the target
`LAG_STEPS` commands back, the tracking lag of a servo following a moving target.
"""
from __future__ import annotations

import numpy as np
import pytest

from twinloop_safety.envelope import Box, EnvelopeMonitor, Fault, HoldUpGuard, State, build_limits
from twinloop_twin.kinematics import UrdfTransforms
from twinloop_twin.physics import COMMANDED_JOINTS
from twinloop_twin.workcell import load_workcell

PERIOD_S = 0.004
TIMEOUT_S = 0.1  # command and joint-state watchdogs
TICK_S = 0.002
LAG_STEPS = 6  # 24 ms: at 0.9 rad/s the measured position lags the target by 21.6 mrad
SPEED = 0.9  # rad/s, under joint 1's 1.0875 rad/s limit
ACCELERATION = 5.0  # rad/s^2, under its 7.5


@pytest.fixture(scope="module")
def workcell():
    return load_workcell()


@pytest.fixture(scope="module")
def kinematics(workcell):
    return UrdfTransforms(workcell.urdf_xml)


def make_monitor(kinematics, measured: dict[str, float]) -> EnvelopeMonitor:
    limits = build_limits(
        kinematics, joint_names=list(COMMANDED_JOINTS), position_margins=[0.05] * 7 + [0.0], velocity_scale=0.5,
        acceleration_limits=[7.5] * 7 + [1.0], max_target_lead=[0.25] * 7 + [0.04], command_period_s=PERIOD_S,
        limit_mode="reject", workspace=Box("workspace", (-0.35, -0.55, 0.755), (0.85, 0.55, 1.75)), keep_out=(),
        cartesian_margin_m=0.02, checked_links=("panda_hand", "panda_hand_tcp"), sample_spacing_rad=0.02,
        max_force_n=60.0, command_timeout_s=TIMEOUT_S, joint_state_timeout_s=TIMEOUT_S)
    monitor = EnvelopeMonitor(limits, kinematics)
    monitor.on_joint_state(list(measured), list(measured.values()), [0.0] * len(measured), 0.0)
    assert monitor.arm() == ""
    return monitor


def smooth_stream(home: dict[str, float], steps: int) -> list[dict[str, float]]:
    """Joint 1 accelerates to SPEED and cruises, one target per PERIOD_S."""
    targets, q, v = [], dict(home), 0.0
    for _ in range(steps):
        v = min(SPEED, v + ACCELERATION * PERIOD_S)
        q = {**q, "panda_joint1": q["panda_joint1"] + v * PERIOD_S}
        targets.append(q)
    return targets


class Run:
    """Hands a stream to the monitor at given handling times, with lagging joint states
    and watchdog ticks, as the node would."""

    def __init__(self, monitor: EnvelopeMonitor, home: dict[str, float]) -> None:
        self.monitor, self.home = monitor, home
        self.sent: list[dict[str, float]] = []
        self.forwarded: list[list[float]] = []
        self.violations = []
        self.next_tick_s = TICK_S

    def measured(self) -> dict[str, float]:
        return self.sent[-1 - LAG_STEPS] if len(self.sent) > LAG_STEPS else self.home

    def joint_state(self, now_s: float) -> None:
        q = self.measured()
        self.monitor.on_joint_state(list(q), list(q.values()), [0.0] * len(q), now_s)

    def ticks_until(self, now_s: float) -> None:
        """Every tick due up to now, each judged at its due time (a running monitor)."""
        while self.next_tick_s <= now_s:
            self.violations.append(self.monitor.tick(self.next_tick_s))
            self.next_tick_s += TICK_S

    def command(self, target: dict[str, float], now_s: float) -> None:
        self.sent.append(target)
        names = list(COMMANDED_JOINTS)
        decision = self.monitor.check_command(names, [target[j] for j in names], now_s)
        self.violations.append(decision.violation)
        if decision.forward is not None:
            self.forwarded.append(decision.forward)

    def faults(self) -> list:
        return [v for v in self.violations if v is not None]


def test_late_and_bunched_commands_of_a_smooth_stream_pass(kinematics, workcell):
    home = dict(workcell.home_joint_positions)
    run = Run(make_monitor(kinematics, home), home)
    stream = smooth_stream(home, 300)
    rng = np.random.default_rng(3)
    now = 0.0
    for k, target in enumerate(stream):
        if k == 100:
            # The monitor's process is not scheduled for 0.3 s (3 watchdog timeouts): no tick
            # runs, and 75 commands with their joint states queue up. Then the one tick due
            # in the stall runs late (judged at its due time), and the queue is handled at once.
            run.violations.append(run.monitor.tick(now + TICK_S))
            stall_end = now + 0.3
            for queued in stream[100:175]:
                run.joint_state(stall_end)
                run.command(queued, stall_end)
            now = stall_end
            run.next_tick_s = now + TICK_S
            continue
        if 100 < k < 175:
            continue
        # Sender jitter: some commands arrive in pairs, others late by up to 3 periods.
        now += PERIOD_S * (0.0 if k % 7 == 3 else rng.uniform(0.25, 3.0) if k % 5 == 0 else 1.0)
        run.ticks_until(now)
        run.joint_state(now)
        run.command(target, now)
    assert run.faults() == [], run.faults()[0].reason
    assert run.monitor.commands_forwarded == len(stream) and run.monitor.state is State.ARMED
    assert run.forwarded == [[t[j] for j in COMMANDED_JOINTS] for t in stream]  # unchanged
    # The measured position lagged 21.6 mrad behind at cruise: referenced to it after the
    # stall, a step would have read as (21.6 + 3.6) mrad / 4 ms = 6.3 rad/s.
    lag = stream[174]["panda_joint1"] - stream[174 - LAG_STEPS]["panda_joint1"]
    assert lag == pytest.approx(SPEED * PERIOD_S * LAG_STEPS, rel=1e-6)


@pytest.mark.parametrize("pause_s, ticking", [(0.06, True), (0.3, False)])
def test_a_jump_after_a_gap_faults(kinematics, workcell, pause_s, ticking):
    # A pause shorter than the watchdog with the monitor running, or a long one while the
    # monitor itself was stalled (no tick): either way the stream must go on from its last
    # target. A sender that skips ahead to where the motion would be by the clock jumps.
    home = dict(workcell.home_joint_positions)
    run = Run(make_monitor(kinematics, home), home)
    stream = smooth_stream(home, 120)
    now = 0.0
    for target in stream[:100]:
        now += PERIOD_S
        run.ticks_until(now)
        run.joint_state(now)
        run.command(target, now)
    assert run.faults() == []
    now += pause_s
    if ticking:
        run.ticks_until(now)
        assert run.faults() == [], "a pause shorter than the watchdog faulted"
    skipped = round(pause_s / PERIOD_S)
    resumed = dict(stream[99], panda_joint1=stream[99]["panda_joint1"] + SPEED * PERIOD_S * (skipped + 1))
    run.command(resumed, now)
    violation = run.faults()[0]
    assert violation.fault is Fault.VELOCITY_LIMIT and violation.joints == ("panda_joint1",)
    # The step read: (skipped + 1) cruise steps in one period.
    assert f"{SPEED * (skipped + 1):+.3f}" in violation.reason, violation.reason
    assert run.monitor.state is State.FAULT and run.monitor.commands_forwarded == 100


def test_a_pause_shorter_than_the_watchdog_resumes_the_stream(kinematics, workcell):
    home = dict(workcell.home_joint_positions)
    run = Run(make_monitor(kinematics, home), home)
    stream = smooth_stream(home, 200)
    now = 0.0
    for k, target in enumerate(stream):
        now += PERIOD_S + (0.09 if k == 100 else 0.0)  # 94 ms without a command
        run.ticks_until(now)
        run.joint_state(now)
        run.command(target, now)
    assert run.faults() == [] and run.monitor.commands_forwarded == 200


def test_a_stalled_sender_faults_at_the_first_tick_due_after_the_timeout(kinematics, workcell):
    home = dict(workcell.home_joint_positions)
    run = Run(make_monitor(kinematics, home), home)
    now = 0.0
    for target in smooth_stream(home, 50):
        now += PERIOD_S
        run.ticks_until(now)
        run.joint_state(now)
        run.command(target, now)
    last_command_s = now
    while not run.faults():
        now += TICK_S / 2  # joint states keep coming
        run.joint_state(now)
        run.ticks_until(now)
    violation = run.faults()[0]
    due_s = run.next_tick_s - TICK_S
    assert violation.fault is Fault.STALE_COMMAND
    assert last_command_s + TIMEOUT_S < due_s <= last_command_s + TIMEOUT_S + TICK_S + 1e-9
    # The robot holds where it was measured at the fault.
    assert run.monitor.hold_positions == pytest.approx({j: run.measured()[j] for j in COMMANDED_JOINTS})


def test_a_late_tick_judges_as_of_its_due_time(kinematics, workcell):
    home = dict(workcell.home_joint_positions)
    monitor = make_monitor(kinematics, home)
    names = list(COMMANDED_JOINTS)
    assert monitor.check_command(names, [home[j] for j in names], 0.01).violation is None
    # Commands and joint states handled up to 0.5 s; a tick due at 0.012 runs only now.
    monitor.on_joint_state(names, [home[j] for j in names], [0.0] * 8, 0.5)
    assert monitor.check_command(names, [home[j] for j in names], 0.5).violation is None
    assert monitor.tick(0.012) is None and monitor.state is State.ARMED
    # Joint states: the watchdog's verdict, not the command's handling time. Commands
    # handled 0.3 s after the last joint state (the states still queued) pass ...
    assert monitor.check_command(names, [home[j] for j in names], 0.8).violation is None
    # ... until a tick due after the timeout finds none.
    assert monitor.tick(0.61).fault is Fault.STALE_JOINT_STATE


def _held_up_run(kinematics, workcell, *, sender_alive: bool):
    """A stream at PERIOD_S; the monitor is held up for 0.5 s (5x the watchdog) after 0.2 s;
    on resumption its first tick runs before anything queued during the hold-up (the order
    in which an executor's threads wake is not fixed), then the queued joint states and
    commands, then ticks again. Ticks go through the node's HoldUpGuard.
    Returns (violations, clock, forwarded count, monitor, end of the hold-up, host time of the fault)."""
    home = dict(workcell.home_joint_positions)
    monitor, clock = make_monitor(kinematics, home), HoldUpGuard(TICK_S, TIMEOUT_S)
    names = list(COMMANDED_JOINTS)
    targets = smooth_stream(home, 400)
    violations, forwarded, host, next_tick, sent, fault_at = [], 0, 0.0, TICK_S, 0, []

    def tick(at):
        if not clock.tick(at):
            return
        violation = monitor.tick(at)
        if violation is not None and not fault_at:
            fault_at.append(at)
        violations.append(violation)

    def handle(target, at):
        nonlocal forwarded
        measured = targets[max(0, sent - 1 - LAG_STEPS)]
        monitor.on_joint_state(names, [measured[j] for j in names], [0.0] * 8, at)
        decision = monitor.check_command(names, [target[j] for j in names], at)
        violations.append(decision.violation)
        forwarded += decision.forward is not None

    while host < 0.2:  # running normally
        host += PERIOD_S
        while next_tick <= host:
            tick(next_tick)
            next_tick += TICK_S
        handle(targets[sent], host)
        sent += 1
    held_until = host + 0.5
    queued = int(0.5 / PERIOD_S) if sender_alive else 0
    host = held_until
    tick(host)  # the first tick after the hold-up, before the queue
    if not sender_alive:  # the robot's joint states queued all the same
        monitor.on_joint_state(names, [home[j] for j in names], [0.0] * 8, host + 1e-4)
    for _ in range(queued):  # the backlog, handled at ~0.1 ms each
        host += 1e-4
        handle(targets[sent], host)
        sent += 1
    next_tick = host + TICK_S
    end = host + 3 * TIMEOUT_S
    while host < end:  # running normally again
        host += PERIOD_S
        while next_tick <= host:
            tick(next_tick)
            next_tick += TICK_S
        if sender_alive:
            handle(targets[sent], host)
            sent += 1
        else:
            monitor.on_joint_state(names, [home[j] for j in names], [0.0] * 8, host)
    return [v for v in violations if v is not None], clock, forwarded, monitor, held_until, fault_at


def test_a_monitor_held_up_longer_than_its_watchdogs_resumes_the_stream(kinematics, workcell):
    faults, clock, forwarded, monitor, *_ = _held_up_run(kinematics, workcell, sender_alive=True)
    assert faults == [] and monitor.state is State.ARMED
    assert clock.hold_ups == 1 and clock.held_up_s == pytest.approx(0.5 - TICK_S, abs=PERIOD_S)
    assert forwarded == int(0.2 / PERIOD_S) + int(0.5 / PERIOD_S) + int(3 * TIMEOUT_S / PERIOD_S)


def test_a_sender_that_died_during_the_hold_up_faults_a_tick_after_the_monitor_resumed(kinematics, workcell):
    faults, clock, _, monitor, held_until, fault_at = _held_up_run(kinematics, workcell, sender_alive=False)
    assert [f.fault for f in faults] == [Fault.STALE_COMMAND] and monitor.state is State.FAULT
    # At the first tick that judges after the hold-up: the next one after the monitor resumed.
    assert clock.hold_ups == 1
    assert held_until < fault_at[0] <= held_until + TICK_S + 1e-9


def test_a_monitor_late_all_the_time_still_judges_every_other_tick():
    guard = HoldUpGuard(0.01, shortest_timeout_s=0.1)  # a hold-up: ticks more than 50 ms apart
    assert all(guard.tick(t * 0.03) for t in range(100))  # 30 ms apart: late, not held up
    judged = [guard.tick(3.0 + t * 0.06) for t in range(1, 21)]  # 60 ms apart: each one held up
    assert judged == [False, True] * 10 and guard.hold_ups == 20


FINGER = "panda_finger_joint1"  # limits [0, 0.04] m, margin 0: home is at the upper limit


def test_a_stream_may_start_from_a_pose_at_or_just_beyond_a_limit(kinematics, workcell):
    home = dict(workcell.home_joint_positions)
    assert home[FINGER] == 0.04
    names = list(COMMANDED_JOINTS)

    def command(monitor, positions, now_s):
        return monitor.check_command(names, [positions[j] for j in names], now_s).violation

    # At the limit: a target computed onto it (ten 4 mm steps from a closed gripper) passes.
    monitor = make_monitor(kinematics, home)
    on_limit = sum([0.004] * 10)
    assert on_limit > 0.04  # one unit in the last place beyond
    assert command(monitor, dict(home, **{FINGER: on_limit}), 0.004) is None
    # From inside the limit, a target beyond it faults.
    violation = command(monitor, dict(home, **{FINGER: 0.0401}), 0.008)
    assert violation.fault is Fault.POSITION_LIMIT and violation.joints == (FINGER,)

    # The gripper rests 30 um beyond its limit (as a real one reports): a stream that starts
    # from there passes, holds, and moves back; a target farther out faults.
    beyond = dict(home, **{FINGER: 0.04003})
    for steps, fault in (([0.04003, 0.04003, 0.04002, 0.04000, 0.03997], None),
                         ([0.04003, 0.04004], Fault.POSITION_LIMIT),
                         ([0.04002, 0.040025], Fault.POSITION_LIMIT)):
        monitor = make_monitor(kinematics, beyond)
        violations = [command(monitor, dict(home, **{FINGER: v}), 0.004 * (k + 1)) for k, v in enumerate(steps)]
        if fault is None:
            assert violations == [None] * len(steps), violations
        else:
            assert violations[:-1] == [None] * (len(steps) - 1) and violations[-1].fault is fault, violations
            assert violations[-1].joints == (FINGER,)

    # An arm joint measured inside its margin band (beyond the limit with margin, inside
    # the URDF's): the same rule. Joint 7 turns the hand about its axis: no Cartesian limit.
    j7_upper = 2.8973 - 0.05
    band = dict(home, panda_joint7=j7_upper + 0.01)
    monitor = make_monitor(kinematics, band)
    assert command(monitor, band, 0.004) is None
    assert command(monitor, dict(band, panda_joint7=j7_upper + 0.009), 0.008) is None
    assert command(monitor, dict(band, panda_joint7=j7_upper + 0.0095), 0.012).fault is Fault.POSITION_LIMIT
