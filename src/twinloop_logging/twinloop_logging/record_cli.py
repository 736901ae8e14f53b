"""twinloop record: start, stop, annotate sessions of the running recorder; its status.

    twinloop record start PROFILE --purpose PURPOSE --split SPLIT [--note TEXT] [--duration S]
    twinloop record annotate "box nudged by hand"
    twinloop record status
    twinloop record stop

Talks to the running recorder node (`--recorder`, default /recorder; `twinloop bringup`
starts one) on $ROS_DOMAIN_ID through twinloop_ros.clients.RecorderClient. PROFILE is one
of config/recording.yaml (calibration, identification, trial, all). `start` prints the bag
path and returns while the recorder goes on recording; with `--wait-for TOPIC ...` it
returns only once the recorder records those topics; with `--duration S` it stays, prints
progress every second, and stops the session after S seconds (Ctrl-C stops it sooner; the
bag is kept either way). `stop` prints what was recorded per topic, with drop estimates.
A relative `--output-dir` is taken from the current directory. Files of a bag:
`twinloop bag info BAG`.

Exit codes: 0 done; 2 bad input (unknown profile, purpose or split, a bag folder that
exists, an empty note); 3 the recorder is not running on this ROS_DOMAIN_ID, did not
answer, or refused for now (already recording, nothing to stop, a topic not found by
--wait-for); 4 the session failed (e.g. storage full; the bag is kept); 130 interrupted.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from twinloop_interfaces.msg import RecordingStatus

from twinloop_logging.session import PURPOSES, SPLITS
from twinloop_ros.clients import ClientError, RecorderClient
from twinloop_ros.command_line import Progress, run_live

PROG = "twinloop record"


def _start(recorder: RecorderClient, args) -> int:
    output_dir = str(Path(args.output_dir).resolve()) if args.output_dir else ""
    bag = recorder.start(profile=args.profile, purpose=args.purpose, split=args.split, output_dir=output_dir,
                         note=args.note, twin_version=args.twin, policy_version=args.policy,
                         session_id=args.session_id, timeout_s=args.timeout)
    print(bag, flush=True)
    if args.wait_for:
        try:
            recorder.wait_until_recording(bag, args.wait_for, timeout_s=args.timeout)
        except (ClientError, KeyboardInterrupt):
            recorder.stop()  # a failed command leaves no session running (the bag is kept)
            raise
    if args.duration <= 0:
        return 0
    progress = Progress()
    deadline = time.monotonic() + args.duration
    try:
        while time.monotonic() < deadline:
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            progress(_one_line(recorder.status))
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted: stopping the session", file=sys.stderr, flush=True)
    return _stop(recorder, args)


def _stop(recorder: RecorderClient, args) -> int:
    bag = recorder.stop(timeout_s=max(args.timeout, 20.0))
    print(f"stopped {bag}")
    _print_topics(recorder.status)
    return 0


def _annotate(recorder: RecorderClient, args) -> int:
    recorder.annotate(args.note, timeout_s=args.timeout)
    status = recorder.wait_for_recorder(args.timeout)
    print(f"annotated {status.bag_path if status else 'the session'}: {args.note}")
    return 0


def _status(recorder: RecorderClient, args) -> int:
    status = recorder.wait_for_recorder(args.timeout)
    if status is None:
        print("idle: no session since the recorder started")
    elif not status.recording:
        print(f"idle; last session {status.bag_path}: {status.message or 'stopped'}")
    else:
        print(f"recording {status.bag_path} (profile {status.profile}, purpose {status.session.purpose}, "
              f"split {status.session.split})")
        print(_one_line(status))
        _print_topics(status)
    return 0


def _one_line(status: RecordingStatus) -> str:
    return (f"{status.duration_s:.1f} s, {len(status.topics)} topics, "
            f"{sum(t.received for t in status.topics)} messages, {status.bytes_written / 1e6:.1f} MB"
            + (f"; {status.message}" if status.message else ""))


def _print_topics(status: RecordingStatus) -> None:
    print(f"  {'topic':44s} {'received':>9s} {'expected':>9s} {'dropped':>8s} {'rate Hz':>8s}")
    for t in sorted(status.topics, key=lambda t: t.topic):
        print(f"  {t.topic:44s} {t.received:9d} {t.expected:9d} {t.dropped_estimate:8d} {t.rate_hz:8.1f}")
    if status.message:
        print(f"  {status.message}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recorder", default="/recorder", help="node name of the recorder")
    parser.add_argument("--timeout", type=float, default=10.0, help="s to wait for the recorder to answer")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a session; prints the bag path")
    start.add_argument("profile", help="profile of config/recording.yaml (calibration, identification, trial, all)")
    start.add_argument("--purpose", choices=PURPOSES, required=True)
    start.add_argument("--split", choices=SPLITS, required=True,
                       help="fit (calibration, identification) or held_out (validation); they never mix")
    start.add_argument("--note", default="", help="operator note stored with the session")
    start.add_argument("--output-dir", default="", help="parent folder of the bag (default: the recorder's)")
    start.add_argument("--twin", default="", help="twin version in use, e.g. emulated/v1")
    start.add_argument("--policy", default="", help="policy version in use")
    start.add_argument("--session-id", default="", help="session id (default: the recorder makes one)")
    start.add_argument("--wait-for", nargs="+", default=[], metavar="TOPIC",
                       help="return once the recorder records these topics (it subscribes as it discovers them)")
    start.add_argument("--duration", type=float, default=0.0,
                       help="s: record this long with progress, then stop (0: leave the session running)")
    sub.add_parser("stop", help="stop the session; prints per-topic counts and drop estimates")
    annotate = sub.add_parser("annotate", help="add a timestamped operator note to the session")
    annotate.add_argument("note")
    sub.add_parser("status", help="what the recorder is recording, per-topic counts")
    args = parser.parse_args(argv)
    if args.command == "annotate" and not args.note.strip():
        parser.error("the note is empty: give the text to store, e.g. twinloop record annotate \"box moved\"")

    def body(session) -> int:
        recorder = RecorderClient(session.node, recorder=args.recorder)
        return {"start": _start, "stop": _stop, "annotate": _annotate, "status": _status}[args.command](recorder, args)

    return run_live(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
