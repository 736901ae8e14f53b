"""twinloop validate: a policy's held-out trials on the robot, scored against a twin version.

    twinloop validate run POLICY --twin TWIN [-n 5] [--output FILE]
    twinloop validate score POLICY --twin TWIN BAG [BAG ...] [--output FILE]

`run` sends N trials of the policy folder to the running policy runner (as `twinloop
trials run`: recorded with the trial profile, split held_out, through the envelope
monitor), then scores their bags as `score` does. `score` scores trial bags already
recorded: each must have split held_out (validation never judges a fit-split bag).

Per trial: the real outcome from the box tracker's pose (the policy's own goal test),
the failure mode, the twin's prediction (the trial replayed in TWIN, a twin version
folder such as twins/emulated/v1), the box's end in the twin against the tracker's, the
replay's joint and end-effector RMSE, the command-to-motion latency, envelope
interventions. Then the round: real and predicted success rates with 95 % intervals.
Every number goes to a JSON file (default validation/<policy>-<workcell>-v<N>-<UTC
time>.json; an existing file is never overwritten).

Exit codes: 0 scored (whatever the success rate); 2 bad input (no such policy or twin, a
bag that is not a held-out trial, no box tracker pose in a bag, an existing --output);
3 the runner is not running on this ROS_DOMAIN_ID or a node it needs is not ready; 4 the
trials failed to run (the message says why); 130 cancelled by Ctrl-C.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop validate", description=inspect.cleandoc(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run held-out trials on the running policy runner, then score them")
    score = commands.add_parser("score", help="score held-out trial bags already recorded")
    for command in (run, score):
        command.add_argument("policy", help="policy folder (policy.yaml + exported module)")
        command.add_argument("--twin", required=True, help="twin version folder, e.g. twins/emulated/v1")
        command.add_argument("--output", default="", help="JSON report to write (default under validation/)")
    run.add_argument("-n", "--trials", type=int, default=5, help="number of held-out trials")
    run.add_argument("--runner", default="/policy_runner", help="node name of the policy runner")
    score.add_argument("bags", nargs="+", help="trial bags (split held_out)")
    args = parser.parse_args(argv)
    if args.command == "run" and args.trials < 1:
        parser.error(f"-n {args.trials}: give at least one trial")
    try:
        scorer, spec, output = _prepare(args)
    except ValueError as error:
        print(f"twinloop validate: error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.command == "score":
        return _score(scorer, spec, [Path(b) for b in args.bags], output)
    return _run(args, scorer, spec, output)


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
        scorer = TrialScorer(Path(args.twin), BoxGoal(tuple(spec.goal_box_xy), spec.goal_radius_m))
    except (TwinError, OSError) as error:
        raise ValueError(f"twin {args.twin}: {error}; give a twin version folder such as twins/emulated/v0") from None
    output = Path(args.output) if args.output else Path("validation") / (
        f"{spec.name}-{scorer.twin_label.replace('/', '-')}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")
    if output.exists():
        raise ValueError(f"{output} exists; a report is never overwritten: give another --output")
    return scorer, spec, output


def _score(scorer, spec, bags: list[Path], output: Path) -> int:
    from twinloop_ros.command_line import Progress
    from twinloop_validation.scoring import ValidationError, format_summary, format_trial, report, summarize

    progress = Progress()
    scores = []
    for index, bag in enumerate(bags):
        progress(f"scoring {bag} in twin {scorer.twin_label} ({index + 1}/{len(bags)})")
        try:
            scores.append(scorer.score(bag))
        except ValidationError as error:
            print(f"twinloop validate: error: {error}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(format_trial(index + 1, scores[-1]), flush=True)
    summary = summarize(scores)
    print(format_summary(summary))
    output.parent.mkdir(parents=True, exist_ok=True)
    body = report(scores, summary, policy=spec.policy_version, twin=scorer.twin_label, twin_path=str(scorer.twin_path))
    with open(output, "x") as stream:  # never over an existing report
        json.dump(body, stream, indent=1, allow_nan=True)
    print(f"report: {output}")
    return 0


def _run(args, scorer, spec, output: Path) -> int:
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
        return _score(scorer, spec, [Path(o.bag_path) for o in result.outcomes], output)

    return run_live("twinloop validate", body)


if __name__ == "__main__":
    sys.exit(main())
