"""twinloop loop: the whole loop on a workcell, one stage after the other, as a user runs it.

    twinloop loop [--quick] [--truth-file F] [--run-dir DIR] [--trials N] [--modes nominal,posterior]
    twinloop loop --resume DIR

In a new run folder (default runs/<UTC time>/; everything the run writes lands there:
twins/, bags/, policies, validation/, log/):

1. the nominal twin v0 (`twinloop twin build-nominal`);
2. with the node set of `twinloop bringup` running on a private, localhost-only ROS domain
   (the emulated workcell with its hidden physics `--truth-file`, or a robot driver with
   `--no-workcell`): the static camera calibrated to the robot (`twinloop calibrate --live
   --camera static_camera`: views planned and moved to through the envelope monitor; the
   wrist camera, seeing the same target, is calibrated with it); the node set is started
   again with the box tracker placing the camera by that calibration (`twinloop bringup
   --tracker-calibration`), as it stays for the rest of the run; then the wrist camera's
   scan of the table (`twinloop build excite --kind scan`, held still at each view) and
   the identification recordings through the envelope monitor, a joint excitation (fit),
   another (held-out, other seed), the box's pushes and lift (fit) (`twinloop build
   excite`; the scan first, while the box stands where it starts); then the node set is
   stopped;
3. the scanned twin v1 (`twinloop build geometry --calibration` the wrist camera's file:
   the measured table, the box's measured start pose, any object the description lacks),
   then the identified twin v2 on it (`twinloop build build`: physics with uncertainty;
   it keeps v1's geometry). Below, "the identified twin" is v2;
4. a carry policy per variation mode (`twinloop policy train`): by default `nominal`
   (trained in v0) and `posterior` (in the identified twin, from its uncertainty); `wide`
   (the identified twin, hand-set ranges) and `oracle` (the truth file: a measurement only
   the emulated cell allows);
5. with the node set up again: held-out trials of each policy on the cell, scored against
   the identified twin (`twinloop validate run`): real success from the box tracker, the
   twin's prediction, errors, staleness; then fit-split trials of each policy (`twinloop
   trials run --split fit`): new data for the correction, never judged;
6. how well the identified twin predicts and ranks the policies (`twinloop validate compare`);
7. the correction (`twinloop validate correct`): the next version from the identified
   twin's mismatch, re-identified on its fit bags and the fit trials; the same held-out
   trials scored against it (`twinloop validate score`) and compared, so that both stand
   side by side. When the rounds implicate nothing, the identified twin stays and the loop
   says so;
8. with the node set up once more, its envelope monitor given a fixture on the table (a
   keep-out box, `--envelope`; where the carry's box and goal lie, so only in this phase):
   `twinloop plan move` behind the fixture, then the reset home around it, both planned
   from where the arm is, checked with the monitor's code and streamed through the
   monitor, which enforces the fixture (the straight move between the two faults on it);
9. the run's page (`twinloop validate report .`): report.html and report.json in the run
   folder, read back from its calibration, twin versions, rounds and bags. The loop prints
   where it is.

The node set is down while identification and training run: on a small host its cameras
and tracker would take the cores those need (here an identification that takes 123 s alone
took 801 s beside it).

Each stage is the `twinloop` command the README shows, run as a subprocess in the run
folder: its progress lines (stderr) appear as it runs, its results (stdout) when it ends
and in log/stages.log; the run stops at the first stage that fails, saying which.
`--quick` uses short recordings (8 s fit, 5 s held-out), the short training setting, 2
held-out trials and 1 fit trial per policy (about 9 minutes here; the tests run it); the
default 15 s and 8 s, the task file's training setting, `--trials` (10) held-out trials
and 2 fit trials per policy.

Resumable: each finished stage is written to log/done.json (its command line and output)
as it ends, the run's settings to log/loop.json. `--resume DIR` runs the same loop in DIR
with those settings: a finished stage is not run again (its artefacts are on disk: the
bags, twin versions, policies and rounds it wrote), the node set starts only for a stage
that needs the cell. A stage that was interrupted runs again; one whose output folder it
left behind refuses to write into it (the message names it: move it aside, then resume).

Exit codes: 0 the loop ran (whatever the success rates); 2 bad input; 3 the node set did
not come up; 4 a stage failed (its command and output named); 130 Ctrl-C.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

TWINLOOP = str(Path(sys.executable).parent / "twinloop")
EXIT_BAD_INPUT, EXIT_NOT_UP, EXIT_FAILED, EXIT_CANCELED = 2, 3, 4, 130
MODES = ("nominal", "posterior", "wide", "oracle")
TRACKER_CAMERA = "static_camera"  # the box tracker's camera (config/box_tracker.yaml), calibrated first
SCAN_CAMERA = "wrist_camera"  # the geometry scan's camera, calibrated with the static one (it locates the target)
QUICK = {"fit_s": 8, "held_out_s": 5, "training": "--contexts 2 --draws 4 --iterations 2 --episodes 16", "trials": 2,
         "fit_trials": 1}
FULL = {"fit_s": 15, "held_out_s": 8, "training": "", "trials": 10, "fit_trials": 2}


class StageFailed(RuntimeError):
    pass


class Loop:
    def __init__(self, run_dir: Path, env: dict, say=print, cell: "NodeSet | None" = None) -> None:
        self.run_dir, self.env, self.say, self.cell = run_dir, env, say, cell
        self.started = time.monotonic()
        self.stages: list[tuple[str, float]] = []
        self.done_file = run_dir / "log" / "done.json"
        self.done: dict[str, str] = {}  # command line -> its stdout, of the stages finished (in any run)
        if self.done_file.is_file():
            self.done = {entry["line"]: entry["stdout"] for entry in json.loads(self.done_file.read_text())}

    def recording(self, line: str, retries: int = 2) -> str:
        """A stage that streams to the robot through the monitor: when the monitor stopped it
        because the stream paused past its watchdog (the sender's process held by a loaded
        host, not the motion), reset the fault as an operator would and run it again, at
        most `retries` times, saying so. Any other failure ends the loop."""
        attempt = 0
        while True:
            try:
                return self.stage(line, cell=True)
            except StageFailed:
                status = subprocess.run([TWINLOOP, "monitor", "status"], cwd=self.run_dir, env=self.env,
                                        capture_output=True, text=True).stdout
                if attempt == retries or not status.startswith("fault stale_command"):
                    raise
            attempt += 1
            self.say(f"the envelope monitor faulted on a paused command stream ({status.strip()}); the sender was "
                     "held by the host: resetting the fault and running the stage again")
            self.stage("twinloop monitor reset --note loop-retry-after-a-paused-stream", cell=True, once=False)

    def stage(self, line: str, timeout_s: float = 3600.0, cell: bool = False, once: bool = True) -> str:
        """Run one `twinloop ...` line in the run folder; its stdout (its stderr is passed
        through). A line finished before (log/done.json) is not run again (`once`); `cell`:
        the stage talks to the cell, so the node set is started first if it is down."""
        if once and line in self.done:
            self.say(f"[{time.monotonic() - self.started:7.1f} s] done earlier: {line}")
            return self.done[line]
        if cell and self.cell is not None and not self.cell.running:
            self.say("starting the node set (twinloop bringup) for the stages that talk to the cell")
            self.cell.start()
        self.say(f"[{time.monotonic() - self.started:7.1f} s] $ {line}")
        started = time.monotonic()
        process = subprocess.Popen([TWINLOOP, *shlex.split(line)[1:]], cwd=self.run_dir, env=self.env,
                                   stdout=subprocess.PIPE, text=True)
        try:
            stdout, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise StageFailed(f"`{line}` ran past {timeout_s:.0f} s") from None
        except KeyboardInterrupt:
            process.send_signal(signal.SIGINT)  # the command cancels its goal and ends
            process.wait(timeout=120)
            raise
        with open(self.run_dir / "log" / "stages.log", "a") as log:
            log.write(f"$ {line}\n{stdout}")
        self.stages.append((line, time.monotonic() - started))
        for text in stdout.strip().splitlines()[-12:]:
            self.say(f"    {text}")
        if process.returncode != 0:
            raise StageFailed(f"`{line}` exit {process.returncode} (its message is above)")
        if once:
            self.done[line] = stdout
            entries = [{"line": k, "stdout": v} for k, v in self.done.items()]
            temporary = self.done_file.with_suffix(".json.tmp")
            temporary.write_text(json.dumps(entries, indent=1))
            os.replace(temporary, self.done_file)  # whole or not at all, whenever the loop is stopped
        return stdout


def main(argv: list[str] | None = None) -> int:
    """twinloop loop: the whole loop on a workcell: identify, train, validate on held-out trials, compare, correct."""
    from twinloop_twin.workcell import default_config_dir

    parser = argparse.ArgumentParser(prog="twinloop loop", description=inspect.cleandoc(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short recordings, short training, 2 held-out and 1 fit "
                        "trial a policy")
    parser.add_argument("--truth-file", default=str(default_config_dir() / "emulated_truth.yaml"),
                        help="hidden physics of the emulated workcell (default: config/emulated_truth.yaml)")
    parser.add_argument("--no-workcell", action="store_true", help="a robot driver provides the hardware contract")
    parser.add_argument("--run-dir", default="", help="new folder of this run (default runs/<UTC time>)")
    parser.add_argument("--trials", type=int, default=None, help="held-out trials per policy (default 10; quick 2)")
    parser.add_argument("--modes", default="nominal,posterior", help="variation modes to train and validate, "
                        "comma-separated, of nominal, posterior, wide, oracle (default: nominal,posterior)")
    parser.add_argument("--resume", default="", metavar="DIR", help="go on with the run in DIR, with its settings "
                        "(log/loop.json), from its first unfinished stage")
    args = parser.parse_args(argv)
    if args.resume:
        given = [f"--{k.replace('_', '-')}" for k, v in vars(args).items()
                 if k != "resume" and v != parser.get_default(k)]
        if given:
            parser.error(f"--resume takes the run's own settings (its log/loop.json); do not give {' '.join(given)}")
        run_dir = Path(args.resume).resolve()
        try:
            settings = json.loads((run_dir / "log" / "loop.json").read_text())
            args = argparse.Namespace(**{**vars(args), **settings})
        except (OSError, ValueError, TypeError) as error:
            print(f"twinloop loop: error: {run_dir} is not a run folder of twinloop loop (no readable log/loop.json: "
                  f"{error}); give the run folder an earlier `twinloop loop` printed", file=sys.stderr)
            return EXIT_BAD_INPUT
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes or len(set(modes)) != len(modes):
        parser.error(f"--modes {args.modes}: give distinct modes of {', '.join(MODES)}")
    if "oracle" in modes and args.no_workcell:
        parser.error("--modes oracle needs the emulated workcell's truth file: a real cell has none")
    setting = dict(QUICK if args.quick else FULL)
    if args.trials is not None:
        if args.trials < 1:
            parser.error(f"--trials {args.trials}: give at least one")
        setting["trials"] = args.trials
    truth = Path(args.truth_file).resolve()
    if not args.no_workcell and not truth.is_file():
        print(f"twinloop loop: error: truth file {truth} not found; give an existing physics YAML "
              "(e.g. config/emulated_truth.yaml)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.no_workcell:
        from twinloop_twin.physics import PhysicsConfigError
        from twinloop_twin.scene import load_truth
        from twinloop_twin.workcell import load_workcell

        try:
            load_truth(truth, load_workcell())
        except PhysicsConfigError as error:
            print(f"twinloop loop: error: --truth-file: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
    if not args.resume:
        run_dir = Path(args.run_dir or Path("runs") / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())).resolve()
        if run_dir.exists():
            print(f"twinloop loop: error: {run_dir} exists; a run never writes into an earlier one: give another "
                  "--run-dir, or go on with it: --resume", file=sys.stderr)
            return EXIT_BAD_INPUT
        (run_dir / "log").mkdir(parents=True)
        (run_dir / "log" / "loop.json").write_text(json.dumps(
            {"quick": args.quick, "truth_file": str(truth), "no_workcell": args.no_workcell, "trials": args.trials,
             "modes": ",".join(modes)}, indent=1))
    from twinloop_ros.process import fresh_domain_id, localhost_env
    # the robot driver's domain on a real cell; a private one beside the emulated cell
    domain = os.environ.get("ROS_DOMAIN_ID", "")
    env = localhost_env(int(domain or 0) if args.no_workcell or domain else fresh_domain_id())
    print(f"twinloop loop: run folder {run_dir}{' (resumed)' if args.resume else ''}; ROS domain "
          f"{env['ROS_DOMAIN_ID']}, localhost only; {'quick' if args.quick else 'full'} setting", flush=True)
    cell = NodeSet(run_dir, env, ["--no-workcell"] if args.no_workcell else ["--truth-file", str(truth)])
    loop = Loop(run_dir, env, say=lambda text: print(text, flush=True), cell=cell)
    resume = f"; go on with `twinloop loop --resume {run_dir}`"
    try:
        _stages(loop, cell, setting, modes, truth)
    except NodeSetDown as error:
        print(f"twinloop loop: error: {error}{resume}", file=sys.stderr)
        return EXIT_NOT_UP
    except StageFailed as error:
        print(f"twinloop loop: error: {error}{resume}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"twinloop loop: interrupted{resume}", file=sys.stderr)
        return EXIT_CANCELED
    finally:
        cell.stop()
    return 0


class NodeSetDown(RuntimeError):
    pass


class NodeSet:
    """`twinloop bringup` as a subprocess of its own session, started and stopped by phase."""

    def __init__(self, run_dir: Path, env: dict, arguments: list[str]) -> None:
        self.run_dir, self.env, self.arguments = run_dir, env, arguments
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.envelope: Path | None = None  # the monitor's parameter file for the next start (None: the shipped one)
        self.tracker_calibration: Path | None = None  # the box tracker's camera calibration (None: the URDF mount)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout_s: float = 180.0) -> None:
        """Up once the monitor answers (the runner, tracker and builder come up beside it);
        nothing to do when it is up."""
        if self.running:
            return
        self.starts += 1
        log = open(self.run_dir / "log" / f"bringup{self.starts}.log", "w")
        options = ["--envelope", str(self.envelope)] if self.envelope is not None else []
        if self.tracker_calibration is not None:
            options += ["--tracker-calibration", str(self.tracker_calibration)]
        self.process = subprocess.Popen([TWINLOOP, "bringup", "--log-dir", f"log/bringup{self.starts}",
                                         *self.arguments, *options], cwd=self.run_dir, env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            # up when the envelope monitor and the recorder answer (every stage that talks
            # to the cell goes through them; 9 processes starting on 2 cores take a while)
            if all(subprocess.run([TWINLOOP, *probe], cwd=self.run_dir, env=self.env,
                                  capture_output=True).returncode == 0
                   for probe in (["monitor", "status"], ["record", "--timeout", "2", "status"])):
                time.sleep(5.0)
                return
            time.sleep(2.0)
        self.stop()
        raise NodeSetDown(f"the node set did not come up within {timeout_s:.0f} s: see "
                          f"{self.run_dir / 'log' / f'bringup{self.starts}.log'}")

    def stop(self) -> None:
        if self.process is None:
            return
        from twinloop_ros.process import interrupt_group

        interrupt_group(self.process)  # Ctrl-C to the bring-up: it stops its nodes
        self.process = None


def _stages(loop: Loop, cell: NodeSet, setting: dict, modes: list[str], truth: Path) -> None:
    loop.stage("twinloop twin build-nominal")
    calibration = _written(loop.recording(f"twinloop calibrate --live --camera {TRACKER_CAMERA}"), loop.run_dir)
    if cell.tracker_calibration != calibration:
        cell.stop()  # started again for the next stage, the tracker placing the camera by the calibration
        cell.tracker_calibration = calibration
    scan = _bag(loop.recording("twinloop build excite --kind scan --split fit"))
    wrist = calibration.parent / f"{SCAN_CAMERA}.yaml"  # written beside it: the camera that located the target
    geometry = _wrote(loop.stage(f"twinloop build geometry --scan {scan}"
                                 + (f" --calibration {wrist.relative_to(loop.run_dir)}" if wrist.is_file() else "")),
                      loop.run_dir)
    fit = _bag(loop.recording(f"twinloop build excite --kind joints --split fit --duration {setting['fit_s']}"))
    held_out = _bag(loop.recording(f"twinloop build excite --kind joints --split held_out --seed 7 "
                                   f"--duration {setting['held_out_s']}"))
    pushes = _bag(loop.recording("twinloop build excite --kind pushes --split fit"))
    if cell.process is not None:
        cell.stop()
        loop.say("node set stopped: identification and training have the cores")
    identified = _wrote(loop.stage(f"twinloop build build --fit {fit} {pushes} --held-out {held_out}"), loop.run_dir)
    for mode in modes:
        source = {"nominal": "--twin twins/emulated/v0", "oracle": f"--oracle-physics {truth}"}.get(
            mode, f"--twin {identified}")
        loop.stage(f"twinloop policy train carry_{mode} --mode {mode} {source} {setting['training']}".strip())
    rounds = []
    for mode in modes:
        loop.stage(f"twinloop validate run carry_{mode} --twin {identified} -n {setting['trials']} "
                   f"--output validation/carry_{mode}", cell=True)
        rounds.append(loop.run_dir / "validation" / f"carry_{mode}")
    fit_trials = []
    for mode in modes:
        fit_trials += _trial_bags(loop.stage(f"twinloop trials run carry_{mode} -n {setting['fit_trials']} --split fit",
                                             cell=True))
    cell.stop()
    if len(rounds) > 1:
        loop.stage("twinloop validate compare " + " ".join(f"validation/{r.name}" for r in rounds))
    out = loop.stage(f"twinloop validate correct --twin {identified} --round "
                     + " ".join(f"validation/{r.name}" for r in rounds) + " --fit " + " ".join(fit_trials))
    corrected = out.strip().splitlines()[-1] if out.strip() else ""
    rescored = []
    if corrected and (loop.run_dir / corrected).is_dir():
        version = Path(corrected).name
        for round_dir in rounds:
            trials = json.loads((round_dir / "report.json").read_text())["trials"]
            mode = round_dir.name
            loop.stage(f"twinloop validate score {mode} --twin {corrected} --output validation/{mode}-{version} "
                       + " ".join(t["bag"] for t in trials))
            rescored.append(loop.run_dir / "validation" / f"{mode}-{version}")
        if len(rescored) > 1:
            loop.stage("twinloop validate compare " + " ".join(f"validation/{r.name}" for r in rescored))
    else:
        loop.say(f"the correction found nothing to correct: {Path(identified).name} stays the twin")
    fixture_moves = _fixture_moves(loop, cell)
    loop.stage("twinloop validate report .", once=False)  # the run's page, from everything on disk now
    loop.say("")
    loop.say(f"the loop ran in {time.monotonic() - loop.started:.0f} s; scanned geometry: {loop.run_dir / geometry}; "
             f"identified twin: {loop.run_dir / identified}"
             + (f"; corrected: {loop.run_dir / corrected}" if rescored else ""))
    for line, seconds in loop.stages:
        loop.say(f"  {seconds:6.0f} s  {line}")
    for round_dir in rounds + rescored:
        report = json.loads((round_dir / "report.json").read_text())
        summary = report["summary"]
        loop.say(f"{round_dir.name}: real success {summary['real_successes']}/{summary['trials']}, "
                 f"{report['twin'].split('/')[-1]} predicts {summary['twin_successes']}/{summary['trials']}; staleness: "
                 f"{summary['staleness']['evidence']}; report {round_dir / 'report.html'}")
    for what, stdout in fixture_moves:
        planned = next((line for line in stdout.splitlines() if line.startswith("path:")), "no plan line")
        loop.say(f"fixture: {what}: {planned}")
    loop.say(f"the run's report: {loop.run_dir / 'report.html'} (every number in {loop.run_dir / 'report.json'})")


# A fixture on the table in front of the robot, as a keep-out box of the envelope monitor
# (xmin ymin zmin xmax ymax zmax, m, world), and a pose behind it: the straight joint-space
# line between it and home crosses the fixture, so both moves must go around it. Where the
# carry's box and goal lie: so it stands only for the loop's last phase, not its trials.
FIXTURE = (0.40, -0.06, 0.75, 0.60, 0.06, 1.25)
BEHIND_FIXTURE = "0.45,0.3,0,-2.5,0,3.6,0.785398"  # the hand 0.94 m high at y = +0.26 m


def _fixture_moves(loop: Loop, cell: NodeSet) -> list[tuple[str, str]]:
    """The node set up again with the fixture in its envelope (the monitor enforces it, the
    planner avoids it): `twinloop plan move` behind the fixture, then the reset home around
    it. Each move is planned from where the arm is and checked by the monitor's code;
    a fault fails the stage."""
    from twinloop_safety.envelope import write_envelope_with_keep_out
    from twinloop_twin.workcell import default_config_dir

    relative = Path("log") / "envelope_fixture.yaml"
    envelope = write_envelope_with_keep_out(default_config_dir() / "envelope.yaml", loop.run_dir / relative,
                                            "fixture", FIXTURE)
    cell.stop()
    cell.envelope = envelope
    loop.say("the last phase: a fixture on the table (a keep-out box the monitor enforces, "
             f"{relative}); the arm goes behind it and is reset home around it")
    try:
        moves = [("behind the fixture", loop.stage(f"twinloop plan move --to {BEHIND_FIXTURE} --envelope {relative}",
                                                   cell=True)),
                 ("reset home around it", loop.stage(f"twinloop plan move --to home --envelope {relative}",
                                                     cell=True))]
    finally:
        cell.stop()
        cell.envelope = None
    return moves


def _written(stdout: str, run_dir: Path) -> Path:
    """The calibration file `twinloop calibrate --live` wrote: its line `written: PATH` (a
    relative path is the calibration server's, whose working folder is the run folder)."""
    lines = [line.split(":", 1)[1].strip() for line in stdout.splitlines() if line.startswith("written:")]
    if not lines:
        raise StageFailed("`twinloop calibrate` said no `written:` file; its output is in log/stages.log")
    return run_dir / lines[-1]  # an absolute path stays as it is


def _wrote(stdout: str, run_dir: Path) -> str:
    """The twin version a build wrote (its line `wrote PATH`), relative to the run folder."""
    lines = [line[len("wrote "):].split(" (v")[0].strip() for line in stdout.splitlines() if line.startswith("wrote ")]
    if not lines:
        raise StageFailed("the build said no `wrote` version; its output is in log/stages.log")
    path = Path(lines[-1])
    return str(path.relative_to(run_dir) if path.is_absolute() and path.is_relative_to(run_dir) else path)


def _trial_bags(stdout: str) -> list[str]:
    """The bags `twinloop trials run` recorded: its lines `trial N: ..., bag PATH`."""
    return [line.rsplit(", bag ", 1)[1].strip() for line in stdout.splitlines()
            if line.startswith("trial ") and ", bag " in line]


def _bag(stdout: str) -> str:
    """The bag an excitation recorded: the last line it printed."""
    return stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    sys.exit(main())
