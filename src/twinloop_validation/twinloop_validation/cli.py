"""twinloop validate: a policy's held-out trials on the robot, scored against a twin version.

    twinloop validate run POLICY --twin TWIN [-n 5] [--output FILE]
    twinloop validate score POLICY --twin TWIN BAG [BAG ...] [--output FILE]
    twinloop validate compare ROUND ROUND [ROUND ...]
    twinloop validate correct --twin TWIN --round ROUND [ROUND ...] [--fit BAG ...] [--widen 2]
    twinloop validate report RUN_DIR

`run` sends N trials of the policy folder to the running policy runner (as `twinloop
trials run`: recorded with the trial profile, split held_out, through the envelope
monitor), then scores their bags as `score` does. `score` scores trial bags already
recorded: each must have split held_out (validation never judges a fit-split bag).

Per trial: the real outcome from the box tracker's pose (the policy's own goal test),
the failure mode, the twin's prediction (the trial replayed in TWIN, a twin version
folder such as twins/emulated/v1), the box's end in the twin against the tracker's, the
replay's joint and end-effector RMSE, the command-to-motion latency, envelope
interventions, and the staleness z (the trial's replay error against the spread of
replays under `--draws` samples of the twin's identified uncertainty). Then the round:
real and predicted success rates with 95 % intervals, and whether the twin is stale (median
z above `--stale-z`).
The round goes to a new folder (default validation/<policy>-<workcell>-v<N>-<UTC time>;
an existing one is never written into): report.json with every number, report.html (one
self-contained page: the box's paths, success rates, real vs twin joint trajectories)
and replays/ (the twin's response to each trial, as bags).

`compare` reads the rounds of several policies against one twin (their report.json) and
says how well the twin's predicted success tracks and ranks the real one, as SIMPLER and
SimFoundry report it: Pearson r and the Mean Maximum Rank Violation (MMRV).

`correct` writes the twin's next version from the mismatch its rounds measured
(twinloop_validation.correction): the parameters the mismatch implicates (the box's
outcome: grip, box mass and friction; a joint's replay beyond its predicted spread: that
joint's dynamics and gain and the delay, and the box and grip where the trial moved the
box; a round judged stale: the whole arm) re-identified from the parent's fit bags and the new
`--fit` bags (e.g. trials recorded with `--split fit`; never a held-out bag, by its split
and by the lineage's provenance), those the data cannot pin down widened `--widen` times,
the reasons in the new version's provenance and correction/report.yaml. It prints the
new version's folder last; nothing is written when the rounds implicate nothing.

`report` reads a `twinloop loop` run folder back (its twin versions, validation rounds and
bags; twinloop_validation.loop_report) into RUN_DIR/report.json and RUN_DIR/report.html:
the lineage, the parameters of each version against the nominal one, success per policy
for the cell and each version, agreement per version, interventions, recordings and drops.

Exit codes: 0 scored, compared or corrected (whatever the success rate); 2 bad input (no
such policy, twin or bag, a bag that is not a held-out trial or that the twin was fit on, no
box tracker pose in a bag, an existing --output, a round's report.json unreadable);
3 the runner is not running on this ROS_DOMAIN_ID or a node it needs is not ready; 4 the
trials failed to run, or correction's identification failed (the message says why); 130
cancelled by Ctrl-C.
"""
from __future__ import annotations

import argparse
import inspect
import json
import shutil
import sys
import time
from pathlib import Path

EXIT_BAD_INPUT, EXIT_FAILED = 2, 4
WIDEN = 2.0  # twinloop_validation.correction.WIDEN
STALE_Z = 3.0  # twinloop_validation.scoring.STALE_Z (not imported here: --help stays quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop validate", description=inspect.cleandoc(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run held-out trials on the running policy runner, then score them")
    score = commands.add_parser("score", help="score held-out trial bags already recorded")
    for command in (run, score):
        command.add_argument("policy", help="policy folder (policy.yaml + exported module)")
        command.add_argument("--twin", required=True, help="twin version folder, e.g. twins/emulated/v1")
        command.add_argument("--output", default="", help="new folder of the round's report (default under "
                             "validation/)")
        command.add_argument("--draws", type=int, default=8, help="posterior samples per trial for the staleness "
                             "check (0: no check; default 8)")
        command.add_argument("--stale-z", type=float, default=STALE_Z, help="a round whose median z is above this "
                             f"marks the twin stale (default {STALE_Z:g})")
        # run: 1, the cores stay with the cell's nodes, which are up (score where they are down)
        command.add_argument("--workers", type=int, default=1 if command is run else 2,
                             help="a trial's draws replayed at once, on threads (default: run 1, the cell's nodes "
                             "keep a core; score 2)")
    run.add_argument("-n", "--trials", type=int, default=5, help="number of held-out trials")
    run.add_argument("--runner", default="/policy_runner", help="node name of the policy runner")
    score.add_argument("bags", nargs="+", help="trial bags (split held_out)")
    compare = commands.add_parser(
        "compare", help="sim-vs-real agreement over several policies' rounds",
        description="Read the rounds of several policies scored against one twin version (each ROUND a folder "
                    "`twinloop validate run|score` wrote, with its report.json) and say how well the twin's "
                    "predicted success tracks the real one: per round the real and predicted rates, then Pearson r "
                    "and the Mean Maximum Rank Violation (MMRV) over the rounds. The prediction is the twin's "
                    "success over its posterior draws where every round has it (scored with --draws > 0, every "
                    "draw replayed), else "
                    "its mean parameters' outcome; the output says which. Prints a table, then one JSON line "
                    "with every number (null where one is undefined, e.g. r when one side is constant). Exit 2 for "
                    "fewer than two rounds, rounds against different twins, a policy given twice, or a folder "
                    "without a readable report.json holding the numbers.")
    compare.add_argument("rounds", nargs="+", help="round folders (each with its report.json)")
    correct = commands.add_parser(
        "correct", help="the twin's next version from its rounds' mismatch",
        description="Write the next version of TWIN from the mismatch its validation rounds measured: the "
                    "implicated parameters re-identified on TWIN's fit bags and the new --fit bags, those the data "
                    "cannot pin down widened; the reasons in the version's provenance. Prints the new version's "
                    "folder last (nothing is written when the rounds implicate nothing).")
    correct.add_argument("--twin", required=True, metavar="TWIN",
                         help="the twin version folder the rounds were scored against, e.g. twins/emulated/v1")
    correct.add_argument("--round", nargs="+", required=True, dest="rounds", metavar="ROUND",
                         help="round folders `twinloop validate run|score` wrote (each with its report.json)")
    correct.add_argument("--fit", nargs="*", default=[], metavar="BAG", help="new fit bags (split fit: a joint "
                         "excitation, trials recorded with --split fit), besides TWIN's own (optional)")
    correct.add_argument("--widen", type=float, default=WIDEN, help="std factor for implicated parameters the data "
                         f"cannot pin down (default {WIDEN:g})")
    correct.add_argument("--stale-z", type=float, default=STALE_Z, help="a trial's joint z above this implicates the "
                         f"joint (default {STALE_Z:g})")
    run_report = commands.add_parser("report", help="a loop run's page: lineage, parameters, success, recordings")
    run_report.add_argument("run_dir", metavar="RUN_DIR", help="a folder `twinloop loop` wrote")
    args = parser.parse_args(argv)
    if args.command == "report":
        return _report(Path(args.run_dir))
    if args.command == "compare":
        return _compare([Path(r) for r in args.rounds])
    if args.command == "correct":
        if not args.widen >= 1.0:
            correct.error(f"--widen {args.widen}: give a factor of at least 1")
        if not args.stale_z > 0:
            correct.error(f"--stale-z {args.stale_z}: give a z above 0")
        return _correct(args)
    command = run if args.command == "run" else score  # its usage line with the error; its prog prefixes ours
    if args.draws < 0 or not args.stale_z > 0:
        command.error(f"--draws {args.draws} / --stale-z {args.stale_z}: give draws >= 0 and a z above 0")
    if args.workers < 1:
        command.error(f"--workers {args.workers}: give at least 1")
    if args.command == "run" and args.trials < 1:
        command.error(f"-n {args.trials}: give at least one trial")
    if args.command == "score":
        # Every bag is looked for before the first is scored: a typo in the last of ten is
        # told at once, not after minutes of scoring the others.
        missing = [b for b in args.bags if not Path(b).exists()]
        if missing:
            print(f"{command.prog}: error: no such trial bag: {', '.join(missing)}; give the bag folders "
                  "(or .mcap files) that `twinloop trials run` recorded", file=sys.stderr)
            return EXIT_BAD_INPUT
    try:
        scorer, spec, output = _prepare(args)
    except ValueError as error:
        print(f"{command.prog}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.command == "score":
        return _score(scorer, spec, [Path(b) for b in args.bags], output, args.stale_z, command.prog)
    return _run(args, scorer, spec, output, command.prog)


def _read_rounds(rounds: list[Path]) -> list[dict]:
    from twinloop_validation.scoring import ValidationError

    reports = []
    for folder in rounds:
        try:
            report = json.loads((folder / "report.json").read_text())
        except (OSError, ValueError) as error:
            raise ValidationError(f"{folder}: no readable report.json ({error}); give the folders "
                                  "`twinloop validate run|score` wrote") from None
        problem = _round_problem(report)
        if problem:
            raise ValidationError(f"{folder}/report.json: {problem}; give the folders `twinloop validate run|score` "
                                  "wrote")
        reports.append(report)
    return reports


def _round_problem(report) -> str:
    """What a round's report lacks for a comparison ('' if nothing)."""
    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if not isinstance(report, dict) or not isinstance(report.get("summary"), dict):
        return "no 'summary' section"
    summary = report["summary"]
    wanted = [(key, report.get(key), isinstance(report.get(key), str), "a text") for key in ("policy", "twin")]
    wanted += [(f"summary.{key}", summary.get(key), number(summary.get(key)), "a number")
               for key in ("real_rate", "twin_rate")]
    if summary.get("twin_posterior_rate") is not None:  # optional: NaN without draws, absent in older rounds
        wanted.append(("summary.twin_posterior_rate", summary["twin_posterior_rate"],
                       number(summary["twin_posterior_rate"]), "a number"))
    problems = [f"{key} {'missing' if value is None else f'is {value!r}, not {kind}'}"
                for key, value, good, kind in wanted if not good]
    return ", ".join(problems)


def _correct(args) -> int:
    from twinloop_builder.identification import IdentificationCancelled, IdentificationError
    from twinloop_builder.recording import RecordingError
    from twinloop_ros.command_line import Progress
    from twinloop_twin.bundle import TwinError
    from twinloop_validation.correction import correct_twin, format_correction
    from twinloop_validation.scoring import ValidationError

    progress = Progress()
    try:
        reports = _read_rounds([Path(r) for r in args.rounds])
        result = correct_twin(Path(args.twin), reports, args.fit, widen=args.widen, stale_z=args.stale_z,
                              progress=lambda stage, fraction, message: progress(message),
                              say=lambda text: print(text, flush=True))
    except (ValidationError, RecordingError, TwinError, OSError) as error:
        print(f"twinloop validate correct: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (KeyError, TypeError, AttributeError) as error:
        print(f"twinloop validate correct: error: a round's report.json lacks what a round holds ({error!r}); give the "
              "folders `twinloop validate run|score` wrote", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (IdentificationError, IdentificationCancelled) as error:
        print(f"twinloop validate correct: error: correction's identification failed: {error}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("twinloop validate correct: interrupted; nothing written", file=sys.stderr)
        return 130
    if result is not None:
        print(format_correction(result))
        print(result.twin_path)
    return 0


def _report(run_dir: Path) -> int:
    from twinloop_twin.bundle import TwinError
    from twinloop_validation.loop_report import write_loop_report
    from twinloop_validation.scoring import ValidationError

    try:
        paths = write_loop_report(run_dir)
    except ValidationError as error:
        print(f"twinloop validate report: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (TwinError, OSError, ValueError, KeyError) as error:
        print(f"twinloop validate report: error: {run_dir}: {error}; give the folder of a `twinloop loop` run",
              file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"report: {paths[0]} and {paths[1]}")
    return 0


def _compare(rounds: list[Path]) -> int:
    from dataclasses import asdict

    from twinloop_validation.scoring import ValidationError, compare_rounds, format_comparison

    try:
        comparison = compare_rounds(_read_rounds(rounds))
    except ValidationError as error:
        print(f"twinloop validate compare: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(format_comparison(comparison))
    numbers = {k: None if isinstance(v, float) and v != v else v for k, v in asdict(comparison).items()}
    print(json.dumps(numbers))  # strict JSON: an undefined r is null, not NaN
    return 0


def _prepare(args):
    """The policy's goal, the twin loaded, the output path checked: before any trial runs."""
    from twinloop_policy.policy_spec import PolicySpecError, load_policy_spec
    from twinloop_twin.bundle import TwinError
    from twinloop_validation.scoring import BoxGoal, TrialScorer

    try:
        spec = load_policy_spec(args.policy)
    except (PolicySpecError, OSError) as error:
        raise ValueError(f"policy {args.policy}: {error}") from None
    if spec.goal_box_xy is None:
        raise ValueError(f"policy {spec.policy_version} has no box goal (trial.goal_box_xy): validation scores "
                         "policies whose trials move the box to a goal")
    try:
        scorer = TrialScorer(Path(args.twin), BoxGoal(tuple(spec.goal_box_xy), spec.goal_radius_m), draws=args.draws,
                             workers=args.workers)
    except (TwinError, OSError) as error:
        raise ValueError(f"twin {args.twin}: {error}; give a twin version folder such as twins/emulated/v0") from None
    output = Path(args.output) if args.output else Path("validation") / (
        f"{spec.name}-{scorer.twin_label.replace('/', '-')}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
    if output.exists() or output.is_symlink():
        raise ValueError(f"{output} exists; a round's report is never written into an existing folder: give "
                         "another --output")
    return scorer, spec, output


def _score(scorer, spec, bags: list[Path], output: Path, stale_z: float, prog: str) -> int:
    """Score `bags` into the new folder `output`; `prog` prefixes its messages (the subcommand's, as argparse's)."""
    from twinloop_ros.command_line import Progress
    from twinloop_validation.report_html import write_round_html
    from twinloop_validation.scoring import ValidationError, format_summary, format_trial, report, summarize

    progress = Progress()
    try:
        output.mkdir(parents=True)  # new: never into an earlier round's folder
    except FileExistsError:
        print(f"{prog}: error: {output} exists; give another --output", file=sys.stderr)
        return EXIT_BAD_INPUT
    scores = []
    try:
        for index, bag in enumerate(bags):
            progress(f"scoring {bag} in twin {scorer.twin_label} ({index + 1}/{len(bags)})")
            scores.append(scorer.score(bag, replay_dir=output / "replays"))
            print(format_trial(index + 1, scores[-1]), flush=True)
    except ValidationError as error:
        shutil.rmtree(output, ignore_errors=True)  # only this round's new folder
        print(f"{prog}: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = summarize(scores, stale_z)
    line = format_summary(summary)
    print(line)
    body = report(scores, summary, policy=spec.policy_version, twin=scorer.twin_label, twin_path=str(scorer.twin_path),
                  goal_box_xy=list(scorer.goal.xy), goal_radius_m=scorer.goal.radius_m, summary_line=line)
    (output / "report.json").write_text(json.dumps(body, indent=1, allow_nan=True))
    if summary.staleness["stale"] is not None:  # the twin's standing, for twin list/show, diagnostics and RViz
        from twinloop_twin.bundle import TwinError
        from twinloop_twin.status import record_verdict
        try:
            record_verdict(scorer.twin_path, summary.staleness["stale"], summary.staleness["evidence"],
                           str(output / "report.json"))
        except (TwinError, OSError) as error:  # the round stands; only the twin's standing is not updated
            print(f"{prog}: warning: the twin's standing was not recorded: {error}", file=sys.stderr)
    progress("writing the HTML page")
    write_round_html(output)
    print(f"report: {output / 'report.json'} and {output / 'report.html'}")
    return 0


def _run(args, scorer, spec, output: Path, prog: str) -> int:
    from twinloop_ros.clients import TrialsClient
    from twinloop_ros.command_line import CANCEL_WAIT, Progress, run_live

    def body(session) -> int:
        progress = Progress()
        result = TrialsClient(session.node, runner=args.runner).run(
            str(Path(args.policy).resolve()), args.trials, split="held_out", record=True,
            on_feedback=lambda f: progress(f"trial {f.trial_index + 1}/{args.trials}: {f.status}"),
            cancel_wait_s=120.0, on_cancel=lambda: progress(CANCEL_WAIT.format(node="the policy runner")))
        for o in result.outcomes:
            progress(f"trial {o.trial_index + 1}: the runner says {'success' if o.success else 'failure'} "
                     f"({o.reason}), bag {o.bag_path}")
        return _score(scorer, spec, [Path(o.bag_path) for o in result.outcomes], output, args.stale_z, prog)

    return run_live(prog, body)


if __name__ == "__main__":
    sys.exit(main())
