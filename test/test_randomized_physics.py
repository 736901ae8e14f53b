"""The README's sequences under any plausible physics: truth files drawn from a seeded distribution.

For each seed (0 and 2; 1 is test_loop.py's), `twinloop_twin.truth_draw` draws a hidden
truth (every joint coefficient and gain within a factor 0.5-2 of nominal, command delay
1-40 ms, box mass and frictions within plausible ranges), the draw is printed (seed and values: `draw_truth(nominal, seed)`
reproduces it) and served by the emulated workcell, and the README's commands run as a user
runs them (the `twinloop` executable, in a scratch working directory, on a private
localhost-only domain):

1. `twinloop demo --truth-file T`: make demo's drive through the envelope monitor and the
   replay of the recorded run in the nominal twin (its own process set);
2. `twinloop bringup --truth-file T` (the nodes these commands need), then against it
   the builder README's three excitations (`twinloop build excite` joints fit, joints
   held-out with seed 7, pushes fit; joint excitations shortened) and one live
   calibration (`twinloop calibrate --live --camera wrist_camera`).

Every command exits 0 with no traceback, the envelope monitor never faults, no node log
holds a traceback, and what the commands produced is checked against the drawn truth: the
calibration against the URDF's camera mount, the recorded response against the drawn
command delay, the pushes against the box's recorded motion. More draws:
`.venv/bin/python bench/randomized_physics.py --seeds 0-9`.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from twinloop_twin.physics import ARM_JOINTS, load_physics
from twinloop_twin.truth_draw import (CAMERA_OFFSET_RANGES, TruthRanges, describe, draw_camera_offsets, draw_truth,
                                      truth_yaml, with_camera_offsets)
from twinloop_twin.workcell import default_config_dir

TWINLOOP = str(Path(sys.executable).parent / "twinloop")
# Seed 1 is test_loop.py's draw: make demo's loop runs these three excitations and the static
# camera's live calibration on it, so the suite does not run them there twice (seeds 0-2
# all passed here; more draws: the bench named above).
SEEDS = (0, 2)
# The stack these commands need (the builder README: workcell, monitor, recorder; the
# calibration server for the calibration); the others idle on the same two cores.
NOT_NEEDED = ("policy_runner", "twin_builder", "replay_server", "ghost_state_publisher")
SEQUENCE = (  # the excitations start from home; the calibration's last view is far from it
    "twinloop build excite --kind joints --split fit --duration 6",
    "twinloop build excite --kind joints --split held_out --seed 7 --duration 5",
    "twinloop build excite --kind pushes --split fit",
    "twinloop calibrate --live --camera wrist_camera --views 6",
)
# Eye-in-hand wrist camera against its URDF mount: test_calibration_server.py holds 0.5 mm /
# 0.1 deg at the reference sensor noise; drawn noise is up to 2x that.
WRIST_TOLERANCE = (1.0e-3, 0.2)  # m, deg
TRACEBACK = re.compile(r"^Traceback \(most recent call last\)", re.M)


def nominal_physics():
    return load_physics(default_config_dir() / "nominal_physics.yaml")


# ---------------------------------------------------------------- the draw (pure)
def test_draws_are_reproducible_plausible_and_loadable(tmp_path):
    nominal, ranges = nominal_physics(), TruthRanges()
    draws = [draw_truth(nominal, seed) for seed in range(20)]
    assert draw_truth(nominal, 7) == draws[7]
    assert len({d.command_delay_s for d in draws}) > 15  # seeds give different cells
    factors = []
    for seed, truth in enumerate(draws):
        path = tmp_path / f"truth_{seed}.yaml"
        path.write_text(truth_yaml(truth, seed=seed))
        loaded = load_physics(path)
        assert loaded.joints == truth.joints and loaded.box == truth.box and loaded.noise == truth.noise
        assert loaded.command_delay_s == pytest.approx(truth.command_delay_s, abs=1e-12)
        assert 1e-3 <= truth.command_delay_s <= 40e-3
        assert ranges.box_mass_kg[0] <= truth.box.mass_kg <= ranges.box_mass_kg[1]
        assert ranges.box_friction[0] <= truth.box.friction <= ranges.box_friction[1]
        assert ranges.finger_friction[0] <= truth.finger_friction <= ranges.finger_friction[1]
        for name, joint in truth.joints.items():
            for key in ("friction_loss", "damping", "armature", "kp", "kv"):
                value, reference = getattr(joint, key), getattr(nominal.joints[name], key)
                if reference is None:
                    assert value is None
                    continue
                factors.append(value / reference)
    factors = np.array(factors)
    # 4 significant digits of rounding at the ends of [0.5, 2]
    assert factors.min() >= 0.5 * (1 - 1e-3) and factors.max() <= 2.0 * (1 + 1e-3)
    # log-uniform: both ends are reached and the median sits near 1
    assert factors.min() < 0.55 and factors.max() > 1.8 and 0.85 < np.median(factors) < 1.18


def test_camera_offsets_are_drawn_within_their_ranges_and_round_trip(tmp_path):
    """Cameras off their mounts (draw_camera_offsets): the length and angle of each drawn
    offset within its range, both ends of the ranges approached, reproducible from the seed,
    written and read back with the physics, which the same seed draws unchanged."""
    from twinloop_twin.scene import camera_offset_transform

    nominal = nominal_physics()
    lengths, angles = {c: [] for c in CAMERA_OFFSET_RANGES}, {c: [] for c in CAMERA_OFFSET_RANGES}
    for seed in range(40):
        offsets = draw_camera_offsets(seed)
        assert offsets == draw_camera_offsets(seed) and [o.camera for o in offsets] == list(CAMERA_OFFSET_RANGES)
        for offset in offsets:
            transform = camera_offset_transform(offset)
            lengths[offset.camera].append(np.linalg.norm(transform[:3, 3]) * 1e3)
            angles[offset.camera].append(math.degrees(math.acos(np.clip((np.trace(transform[:3, :3]) - 1) / 2, -1, 1))))
    for camera, ((mm_low, mm_high), (deg_low, deg_high)) in CAMERA_OFFSET_RANGES.items():
        mm, deg = np.array(lengths[camera]), np.array(angles[camera])
        print(f"{camera}: {mm.min():.2f}-{mm.max():.2f} mm, {deg.min():.3f}-{deg.max():.3f} deg")
        # rounding: 0.01 mm, 1e-4 deg per axis
        assert mm.min() >= mm_low - 0.02 and mm.max() <= mm_high + 0.02
        assert deg.min() >= deg_low - 1e-3 and deg.max() <= deg_high + 1e-3
        assert mm.min() < mm_low + 0.2 * (mm_high - mm_low) and mm.max() > mm_high - 0.2 * (mm_high - mm_low)
        assert deg.min() < deg_low + 0.2 * (deg_high - deg_low) and deg.max() > deg_high - 0.2 * (deg_high - deg_low)
    truth = with_camera_offsets(draw_truth(nominal, 3), draw_camera_offsets(3))
    path = tmp_path / "truth.yaml"
    path.write_text(truth_yaml(truth, seed=3))
    loaded = load_physics(path)
    assert loaded.unmodelled == truth.unmodelled and loaded.joints == draw_truth(nominal, 3).joints
    assert "static_camera off its mount" in describe(truth, nominal)


# ---------------------------------------------------------------- the README's sequences
@dataclass
class Step:
    command: str
    code: int | None
    seconds: float
    output: str  # stdout then stderr
    stdout: str = ""

    @property
    def failed(self) -> bool:
        return self.code != 0 or bool(TRACEBACK.search(self.output))


@dataclass
class DrawRun:
    seed: int
    truth_path: Path
    steps: list[Step] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    measured: dict[str, float] = field(default_factory=dict)
    retried: list[str] = field(default_factory=list)  # steps played again, and why

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        lines = [f"seed {self.seed}: {'ok' if self.ok else 'FAILED'} (truth file {self.truth_path})"]
        lines += [f"  [{s.seconds:5.0f} s] exit {s.code}: {s.command}" for s in self.steps]
        lines += [f"  {key}: {value:.4g}" for key, value in self.measured.items()]
        lines += [f"  played again: {r}" for r in self.retried]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)


def run_draw(seed: int, work: Path, *, twins: Path | None = None, say=print) -> DrawRun:
    """Draw the truth for `seed`, then run the README's sequences on it in `work` (the
    nominal twin goes to `twins`, default work/twins)."""
    from twinloop_ros.process import fresh_domain_id, localhost_env

    nominal = nominal_physics()
    truth = draw_truth(nominal, seed)
    work.mkdir(parents=True, exist_ok=True)
    truth_path = work / f"truth_seed{seed}.yaml"
    truth_path.write_text(truth_yaml(truth, seed=seed))
    say(describe(truth, nominal))
    run = DrawRun(seed, truth_path)
    env = localhost_env(fresh_domain_id())

    def command(line: str, timeout_s: float = 300.0) -> Step:
        argv = shlex.split(line)
        started = time.monotonic()
        # Its own session: a command that hangs is stopped with the nodes it started (the demo's).
        process = subprocess.Popen([TWINLOOP, *argv[1:]], cwd=work, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
            step = Step(line, process.returncode, time.monotonic() - started, stdout + stderr, stdout)
        except subprocess.TimeoutExpired:
            _stop_group(process)
            stdout, stderr = process.communicate()
            step = Step(line, None, time.monotonic() - started, f"timed out after {timeout_s:.0f} s\n{stdout}{stderr}")
        run.steps.append(step)
        say(f"seed {seed} $ {line}  -> exit {step.code} in {step.seconds:.0f} s")
        if step.failed:
            run.problems.append(f"`{line}` exit {step.code}: {_tail(step.output)}")
        return step

    line = f"twinloop demo --truth-file {truth_path} --twins {twins or 'twins'} --bags bags/demo --log-dir log/demo"
    demo = command(line)
    stalled = re.search(r"fault \d+ (no joint state for \d+ ms \(limit \d+ ms\))", demo.output)
    if demo.failed and stalled:
        # The emulated workcell publishes its joint states whatever the physics: silence on
        # /joint_states is the host holding its process (or the monitor's), not the drawn truth
        # (seen once in a full-suite run: 'no joint state for 251 ms (limit 250 ms)'). Played
        # again, once, and said; a second fault counts.
        say(f"seed {seed}: the demo's monitor saw {stalled.group(1)}: the host held a process; played again")
        run.retried.append(f"`{line}`: {stalled.group(1)}")
        run.problems = [p for p in run.problems if line not in p]
        demo = command(line)
    if not demo.failed:
        _check_demo(run, demo.output, work, truth)
    run.problems += _tracebacks(work / "log" / "demo")
    _run_on_bringup(run, work, env, truth, command, say)
    return run


def _run_on_bringup(run: DrawRun, work: Path, env: dict, truth, command, say) -> None:
    from twinloop_interfaces.msg import EnvelopeStatus
    from twinloop_ros.qos import LATCHED
    from twinloop_ros.session import RosSession

    log = open(work / "bringup.log", "w")
    bringup = subprocess.Popen([TWINLOOP, "bringup", "--truth-file", str(run.truth_path), "--log-dir", "log/bringup",
                                "--without", *NOT_NEEDED], cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    probe = RosSession(int(env["ROS_DOMAIN_ID"]), "randomized_physics_probe")
    try:
        status = probe.collect(EnvelopeStatus, "/twinloop/envelope/status", LATCHED)

        def up() -> bool:
            services = {name for name, _ in probe.node.get_service_names_and_types()}
            return bool(status) and "/recorder/start" in services and \
                "/calibration_server/calibrate/_action/send_goal" in services
        try:
            probe.wait_for(up, 120.0, "twinloop bringup's nodes")
        except TimeoutError as error:
            run.problems.append(f"`twinloop bringup --truth-file {run.truth_path}`: {error}")
            return
        for line in SEQUENCE:
            step = command(line)
            faults = [m.reason for _, m in status if m.fault]
            held = _sender_held_up(step, faults, work)
            for _ in range(2):
                if not held:
                    break
                # The host held the sender (`twinloop build excite`, a Python process) longer
                # than the monitor's command watchdog: the fault was right, and says nothing
                # about the drawn physics. Reset it as an operator would and play the step
                # again, at most twice, each time only on that diagnosis; any other fault
                # counts. (Once was not enough in a fresh-clone run: the pushes' sender was
                # held 668 ms, then the replay faulted too.)
                say(f"seed {run.seed}: {held}; `twinloop monitor reset` and `{line}` again")
                run.retried.append(f"`{line}`: {held}")
                run.problems = [p for p in run.problems if line not in p]
                status.clear()
                reset = command("twinloop monitor reset --note sender-held-up-by-the-host")
                step = command(line) if not reset.failed else step
                faults = [m.reason for _, m in status if m.fault]
                held = _sender_held_up(step, faults, work)
            if faults:
                run.problems.append(f"`{line}`: envelope fault {faults[0]}")
            if step.failed or faults:
                break  # a latched fault would fail every later command for the same reason
            if line.startswith("twinloop calibrate"):
                _check_calibration(run, step.output, work)
            else:
                _check_excitation(run, line, step.stdout.strip().splitlines()[-1], work, truth)  # prints the bag
    finally:
        probe.close()
        bringup.send_signal(signal.SIGINT)  # Ctrl-C: it stops its nodes
        try:
            code = bringup.wait(timeout=60.0)
        except subprocess.TimeoutExpired:
            _stop_group(bringup)
            code = bringup.wait()
        log.close()
        if code != 0:
            run.problems.append(f"`twinloop bringup` exit {code} on Ctrl-C: {_tail((work / 'bringup.log').read_text())}")
        run.problems += _tracebacks(work / "log" / "bringup")


def _sender_held_up(step: Step, faults: list[str], work: Path) -> str:
    """Why a stale-command fault of an excitation was the host's doing, or "": in the recorded
    bag, the sender's own header stamps (its clock when it published) or the recorder's
    receive times of the same stream show a gap of more than half the watchdog's limit; or
    they show none, and the monitor's own process was the one held. The
    sender publishes every 4 ms whatever the robot does (a hold is at most 0.2 s), so no
    physics makes its stream fall silent for 250 ms: the process was not running, or its
    messages sat on the loaded host (fresh-clone runs: sender stamps 504 ms apart; and
    stamps in time but one message received 610 ms after the one before, while the
    recorder's joint states never paused more than 19 ms)."""
    limit = re.search(r"no command for \d+ ms \(limit (\d+) ms\)", faults[0] if faults else "")
    bag = re.search(r"^recording (\S+)$", step.output, re.M)  # the CLI's stderr line
    if not step.command.startswith("twinloop build excite") or not limit or not bag:
        return ""
    from twinloop_logging.bag_reader import BagError, open_bag
    stamps = received = None
    for _ in range(20):  # the recorder may still be closing the bag the command just ended
        try:
            with open_bag(work / bag.group(1)) as reader:
                messages = list(reader.messages(["/twinloop/builder/command"]))
            stamps = np.sort([m.msg.header.stamp.sec + m.msg.header.stamp.nanosec * 1e-9 for m in messages])
            received = np.sort([m.log_time_ns * 1e-9 for m in messages])
            break
        except BagError:
            time.sleep(0.5)
    if stamps is None or len(stamps) < 2:
        return ""
    # The silence the watchdog judged lies near the stream's end (the sender stops on the
    # fault, up to a status round trip later): the gaps of its last second, not those
    # between pushes, where the monitor is disarmed. (A fresh run: the sender paused 439 ms
    # by its own clock, went on for 190 ms, and the monitor, behind, judged 509 ms.)
    window_s = 1.0
    sent_gap_s = float(np.diff(stamps[stamps >= stamps[-1] - window_s]).max(initial=0.0))
    received_gap_s = float(np.diff(received[received >= received[-1] - window_s]).max(initial=0.0))
    if max(sent_gap_s, received_gap_s) * 1e3 <= 0.5 * int(limit.group(1)):
        # Sent and received in time, yet the monitor judged the stream silent: its own process
        # was held (a fresh-clone run, with the box tracker at the control path's priority:
        # last gaps 4-12 ms, fault 'no command for 500 ms'). Still not the drawn physics.
        return (f"the monitor saw no command for {limit.group(1)} ms while the sender's stamps and the recorder's "
                f"receive times paused at most {max(sent_gap_s, received_gap_s) * 1e3:.0f} ms: the monitor's "
                "process was held by the host")
    return (f"the sender's stream paused {sent_gap_s * 1e3:.0f} ms by its own clock and {received_gap_s * 1e3:.0f} ms "
            f"as the recorder received it (watchdog {limit.group(1)} ms)")


def _check_demo(run: DrawRun, output: str, work: Path, truth) -> None:
    match = re.search(r"envelope monitor: (\d+) commands forwarded, (\d+) rejected, fault (\d+)", output)
    replay = re.search(r"end-effector RMSE: ([0-9.]+) mm", output)
    recorded = re.search(r"recorded: (\S+) \(", output)
    if not match or not replay or not recorded:
        run.problems.append("`twinloop demo` did not report the monitor's counts, the bag and the replay")
        return
    _check_replay(run, "twinloop demo", work / recorded.group(1), truth)
    forwarded, rejected, fault = map(int, match.groups())
    run.measured["demo commands forwarded"] = forwarded
    run.measured["demo replay in the nominal twin, end-effector RMSE mm"] = float(replay.group(1))
    if rejected or fault or forwarded < 1400:  # the 6 s tour at 250 Hz is 1500 commands
        run.problems.append(f"`twinloop demo`: monitor forwarded {forwarded}, rejected {rejected}, fault {fault}")


def _check_calibration(run: DrawRun, output: str, work: Path) -> None:
    from twinloop_calibration import se3
    from twinloop_calibration.calibration_io import load_calibration
    from twinloop_twin.kinematics import UrdfTransforms
    from twinloop_twin.workcell import load_workcell

    written = re.search(r"^written: (.+)$", output, re.M)
    if not written:
        run.problems.append("`twinloop calibrate --live` named no calibration file")
        return
    estimate, _ = load_calibration(work / written.group(1).strip())
    workcell = load_workcell()
    kinematics = UrdfTransforms(workcell.urdf_xml)
    home = workcell.home_joint_positions
    hand_T_wrist = (se3.inv(kinematics.world_T_link("panda_hand", home))
                    @ kinematics.world_T_link("wrist_camera_color_optical_frame", home))
    translation_m, rotation_rad = se3.errors(estimate, hand_T_wrist)
    run.measured["wrist calibration error mm"] = translation_m * 1e3
    run.measured["wrist calibration error deg"] = math.degrees(rotation_rad)
    if translation_m > WRIST_TOLERANCE[0] or math.degrees(rotation_rad) > WRIST_TOLERANCE[1]:
        run.problems.append(f"wrist camera calibrated {translation_m * 1e3:.2f} mm / {math.degrees(rotation_rad):.3f} "
                            f"deg from its URDF mount (tolerance {WRIST_TOLERANCE[0] * 1e3:.1f} mm / "
                            f"{WRIST_TOLERANCE[1]} deg)")


def _check_excitation(run: DrawRun, line: str, bag_line: str, work: Path, truth) -> None:
    from twinloop_logging.bag_reader import BagError, open_bag

    try:
        with open_bag(work / bag_line) as bag:
            states = bag.joint_states("/joint_states", list(ARM_JOINTS))
            box = [m.msg.pose.position for m in bag.messages(["/twinloop/emulated_workcell/box_pose"])]
            stats = bag.topic_stats.get("/joint_states", {})
    except BagError as error:
        run.problems.append(f"`{line}` printed {bag_line!r}, not a readable bag: {error}")
        return
    seconds = (states.stamps_ns[-1] - states.stamps_ns[0]) * 1e-9
    if len(states.stamps_ns) < 0.95 * 500 * seconds or stats.get("dropped_estimate", 0):
        run.problems.append(f"`{line}`: {len(states.stamps_ns)} joint states over {seconds:.1f} s "
                            f"({stats.get('dropped_estimate')} dropped); expected 500 Hz")
    if "pushes" in line:
        moved_m = math.dist((box[0].x, box[0].y), (box[-1].x, box[-1].y))
        run.measured["box moved by the pushes m"] = moved_m
        if moved_m < 0.01:  # three pushes of 4-5 cm through the box
            run.problems.append(f"`{line}`: the box moved {moved_m * 1e3:.1f} mm")
    elif "--split fit" in line:
        _check_replay(run, line, work / bag_line, truth)


def _check_replay(run: DrawRun, line: str, bag: Path, truth) -> None:
    """The recording is the drawn truth's motion: replayed (the workcell's applied commands, on
    its physics clock) in the drawn physics it matches to the encoder noise, in the nominal
    physics it does not."""
    from twinloop_sim.replay import load_recorded_run, replay
    from twinloop_sim.workcell_sim import WorkcellSimulation
    from twinloop_twin.kinematics import UrdfTransforms
    from twinloop_twin.physics import COMMANDED_JOINTS
    from twinloop_twin.workcell import load_workcell

    workcell = load_workcell()
    kinematics = UrdfTransforms(workcell.urdf_xml)
    recorded = load_recorded_run(bag, list(COMMANDED_JOINTS))
    # A workcell more than 1 s behind wall time skips ahead (its stamps jump, its physics does
    # not): the replay's clock holds up to the first such jump only.
    jumps = np.flatnonzero(np.diff(recorded.state_t) > 0.01)
    if len(jumps):
        end_s = recorded.state_t[jumps[0]]
        run.measured["workcell skipped ahead (more than 1 s behind) after s"] = end_s
        if end_s < 2.0:
            return
        keep = recorded.state_t <= end_s
        recorded = dataclasses.replace(recorded, state_t=recorded.state_t[keep], state_q=recorded.state_q[keep],
                                       commands=[c for c in recorded.commands if c[0] <= end_s])
    rmse = {name: replay(recorded, WorkcellSimulation(workcell, physics), kinematics).joint_rmse_rad[:7].max()
            for name, physics in (("drawn", truth), ("nominal", nominal_physics()))}
    label = "demo" if "demo" in line else "fit excitation"
    run.measured[f"{label} replayed, worst arm joint RMSE mrad: drawn physics"] = rmse["drawn"] * 1e3
    run.measured[f"{label} replayed, worst arm joint RMSE mrad: nominal physics"] = rmse["nominal"] * 1e3
    # A true-physics twin replays a DDS recording to ~0.2 mrad (README); on the demo runs of
    # seeds 0-2 here 0.17-0.53 mrad, growing with the host's load (load 7-12), while the nominal
    # physics was 13-22 mrad off. 1 mrad, and the nominal physics at least 5x worse.
    limit = 1.0e-3
    if rmse["drawn"] > limit or rmse["nominal"] < 5 * rmse["drawn"]:
        run.problems.append(f"`{line}`: replayed in the drawn physics the recording is off by {rmse['drawn'] * 1e3:.2f} "
                            f"mrad (limit {limit * 1e3:.2f}), in the nominal physics {rmse['nominal'] * 1e3:.2f} mrad: "
                            "the workcell does not serve the drawn truth")


def _tracebacks(log_dir: Path) -> list[str]:
    return [f"traceback in {path}: {_tail(path.read_text())}" for path in sorted(log_dir.glob("*.log"))
            if TRACEBACK.search(path.read_text(errors="replace"))]


def _stop_group(process: subprocess.Popen) -> None:
    """SIGINT to a command's whole session (it and the nodes it started), SIGKILL after 20 s."""
    for sig, wait_s in ((signal.SIGINT, 20.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-lines:])


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    return tmp_path_factory.mktemp("twins")  # the nominal twin v0, written by the first demo


@pytest.mark.ros
@pytest.mark.timeout(900)
# Under drawn physics (lower gains, longer delays) and on a loaded host the pushes lagged
# the target by more than the monitor's max_target_lead (0.251 rad vs 0.25) and faulted;
# the player now paces itself to the robot (config/excitation.yaml pause_lead).
@pytest.mark.parametrize("seed", SEEDS)
def test_readme_sequences_under_drawn_physics(seed, tmp_path, twins):
    run = run_draw(seed, tmp_path, twins=twins)
    print(run.summary())
    assert run.ok, run.summary()
