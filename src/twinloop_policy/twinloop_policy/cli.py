"""twinloop policy: make and inspect policy folders.

    twinloop policy scripted FOLDER [--goal Q1..Q7] [--rate 250] [--timeout 8]
    twinloop policy train FOLDER [--mode posterior] [--twin twins/emulated/vN] ...  (train_cli.py)

Exit codes: 0 done, 2 bad input (the message says what to do).

`twinloop trials run POLICY -n N` (trials_main, below: its docstring has its exit codes)
runs a policy folder's trials on the running policy runner.
"""
from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from twinloop_policy import scripted, train_cli  # torch: only for the commands that write policies

    parser = argparse.ArgumentParser(prog="twinloop policy", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    scripted.add_arguments(commands.add_parser(
        "scripted", help="write a scripted (untrained) TorchScript policy that drives the arm to a goal"))
    train_cli.add_arguments(commands.add_parser(
        "train", help="train the carry policy in a twin (teacher, student) and export it for the runner",
        description=train_cli.__doc__.split("\n\n")[0]))
    args = parser.parse_args(argv)
    return train_cli.run(args) if args.command == "train" else scripted.run(args)


def trials_main(argv: list[str] | None = None) -> int:
    """twinloop trials: run a policy's trials on the running policy runner, with progress.

    twinloop trials run POLICY -n N [--split held_out] [--no-record] [--trial-timeout S]

    Sends a RunTrials goal to the running policy runner (`--runner`, default /policy_runner)
    on $ROS_DOMAIN_ID through twinloop_ros.clients.TrialsClient. Per trial the runner resets
    the scene, records the trial (profile `trial`, the given split), arms the envelope
    monitor, runs the policy until its goal, its timeout or a monitor fault, and disarms.
    Progress lines show each trial's stage; the end lists each trial's outcome and bag.
    POLICY is a policy folder (policy.yaml + module), e.g. from `twinloop policy scripted`;
    a relative path is taken from the current directory. Ctrl-C cancels the goal (the
    runner ends it after the running trial).

    Exit codes: 0 the trials ran (each one's success is printed); 2 bad input (no such
    policy, a policy that does not fit the robot, a bad split); 3 the runner is not running
    on this ROS_DOMAIN_ID, is busy, or a node it needs (recorder, monitor, reset service) is
    not ready; 4 the run failed (e.g. the monitor refused to arm; the message says why);
    130 cancelled by Ctrl-C.
    """
    from twinloop_ros.clients import TrialsClient
    from twinloop_ros.command_line import CANCEL_WAIT, Progress, run_live

    prog = "twinloop trials"
    parser = argparse.ArgumentParser(prog=prog, description=inspect.cleandoc(trials_main.__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runner", default="/policy_runner", help="node name of the policy runner")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run N trials of a policy folder and list their outcomes")
    run.add_argument("policy", help="policy folder (policy.yaml + exported module)")
    run.add_argument("-n", "--trials", type=int, default=1, help="number of trials")
    run.add_argument("--split", choices=("fit", "held_out"), default="held_out",
                     help="split the trial bags are recorded as (held_out: validation data)")
    run.add_argument("--no-record", action="store_true", help="do not record the trials")
    run.add_argument("--trial-timeout", type=float, default=0.0, help="s per trial (0: the policy.yaml's)")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error(f"-n {args.trials}: give at least one trial")

    def body(session) -> int:
        progress = Progress()
        result = TrialsClient(session.node, runner=args.runner).run(
            str(Path(args.policy).resolve()), args.trials, split=args.split, record=not args.no_record,
            trial_timeout_s=args.trial_timeout,
            on_feedback=lambda f: progress(f"trial {f.trial_index + 1}/{args.trials}: {f.status}"),
            # the runner ends the goal once the running trial is over
            cancel_wait_s=120.0, on_cancel=lambda: progress(CANCEL_WAIT.format(node="the policy runner")))
        for o in result.outcomes:
            print(f"trial {o.trial_index + 1}: {'success' if o.success else 'failure'} ({o.reason}), "
                  f"{o.duration_s:.1f} s" + (f", bag {o.bag_path}" if o.bag_path else ""))
        print(f"{sum(o.success for o in result.outcomes)} of {len(result.outcomes)} trials succeeded")
        return 0

    return run_live(prog, body)


if __name__ == "__main__":
    sys.exit(main())
