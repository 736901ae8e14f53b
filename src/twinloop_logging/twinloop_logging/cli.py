"""twinloop bag: record a profile, inspect a bag, repair a bag.

    twinloop bag record calibration --purpose calibration --split fit [--duration 30]
    twinloop bag info bags/20261202T153000Z-emulated_panda-calibration [--json]
    twinloop bag repair bags/20261202T153000Z-emulated_panda-calibration

`info` reads a rosbag2 folder, a bare .mcap or .db3 file, or a ROS 1 .bag; for MCAP it
reads every chunk (CRC-checked) and compares what the files hold with metadata.yaml.
`repair` works on a bag folder only and changes nothing when the bag is intact.

Exit status: 0 done; 2 bad input: not a bag, a damaged bag (info prints what it could
read, then what is wrong; repair recovers it), an invalid option (the message says what to
do); the recorder's own exit status for `record`.
"""
from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
import time
from dataclasses import asdict

from twinloop_logging.bag_reader import BagError, open_bag
from twinloop_logging.integrity import NotMcapError, check_bag
from twinloop_logging.repair import RepairError, repair_bag
from twinloop_logging.session import PURPOSES, SPLITS


class OptionError(ValueError):
    """A command-line value out of range; the message says what is allowed."""


def _record(args) -> int:
    for name, value in (("--split-size", args.split_size), ("--split-duration", args.split_duration),
                        ("--duration", args.duration)):
        if not math.isfinite(value) or value < 0:
            raise OptionError(f"{name} must be a finite number >= 0 (0: off), got {value}")
    params = {"autostart_profile": args.profile, "autostart_purpose": args.purpose,
              "autostart_split": args.split, "autostart_session_id": args.session_id,
              "autostart_note": args.note, "split_size_bytes": args.split_size,
              "split_duration_s": float(args.split_duration), "compress": args.compress}
    if args.output_dir:
        params["output_dir"] = args.output_dir
    command = [sys.executable, "-m", "twinloop_logging.recorder_node", "--ros-args"]
    for name, value in params.items():
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        command += ["-p", f"{name}:={text}" if text else f"{name}:=''"]
    # The node runs as a child so that Ctrl-C, --duration and a crash all end in the same
    # place: SIGINT to the node, which finalizes the bag.
    child = subprocess.Popen(command)
    deadline = time.monotonic() + args.duration if args.duration > 0 else None
    try:
        while child.poll() is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
    return child.wait()


def _info(args) -> int:
    with open_bag(args.bag) as bag:
        check = check_bag(bag.path) if bag.format in ("rosbag2-mcap", "mcap") else None
        session = bag.session
        info = {"path": str(bag.path), "format": bag.format, "messages": bag.message_count,
                "start_ns": bag.start_ns if bag.message_count else 0,
                "duration_s": (bag.end_ns - bag.start_ns) * 1e-9 if bag.message_count else 0.0,
                "topics": {t.name: {"type": t.type, "count": t.count, **{k: v for k, v in
                           bag.topic_stats.get(t.name, {}).items() if k not in ("topic", "type")}}
                           for t in bag.topics.values()},
                "session": asdict(session) if session else None,
                "custom_data": {k: v for k, v in bag.custom_data.items() if k not in
                                ("twinloop.session", "twinloop.topic_stats")},
                "problems": check.problems if check else []}
        if check:
            for name, topic in info["topics"].items():
                topic["in_files"] = check.topics.get(name, 0)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_info(info, session)
    if check and check.problems:
        count = len(check.problems)
        print(f"twinloop bag: error: bag {bag.path} is damaged or not what its metadata says ({count} "
              f"problem{'s' if count > 1 else ''}, listed above); run `twinloop bag repair "
              f"{bag.path if bag.path.is_dir() else '<a folder holding only this file>'}`", file=sys.stderr)
        return 2
    return 0


def _print_info(info: dict, session) -> None:
    print(f"bag:       {info['path']} ({info['format']})")
    print(f"messages:  {info['messages']} over {info['duration_s']:.3f} s")
    if session:
        print(f"session:   {session.session_id}: purpose {session.purpose}, split {session.split}, "
              f"profile {session.profile or '-'}, robot {session.robot or '-'}, host {session.host or '-'}")
        print(f"versions:  twin {session.twin_version or '-'}, policy {session.policy_version or '-'}")
        if session.operator_note:
            print(f"note:      {session.operator_note}")
        for a in session.annotations:
            print(f"annotated: {time.strftime('%H:%M:%S', time.gmtime(a.time_ns / 1e9))}Z {a.note}")
    for key, value in info["custom_data"].items():
        print(f"{key}: {value}")
    print(f"{'topic':40s} {'type':34s} {'count':>8s} {'in files':>9s} {'expected':>9s} {'dropped':>8s}")
    for name, t in sorted(info["topics"].items()):
        print(f"{name:40s} {t['type']:34s} {t['count']:8d} {str(t.get('in_files', '-')):>9s} "
              f"{str(t.get('expected', '-')):>9s} {str(t.get('dropped_estimate', '-')):>8s}")
    for problem in info["problems"]:
        print(f"problem:   {problem}")


def _repair(args) -> int:
    print(repair_bag(args.bag).text())
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop bag", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    record = sub.add_parser("record", help="record a profile of config/recording.yaml until Ctrl-C")
    record.add_argument("profile")
    record.add_argument("--purpose", choices=PURPOSES, default="demonstration")
    record.add_argument("--split", choices=SPLITS, default="fit")
    record.add_argument("--session-id", default="")
    record.add_argument("--note", default="")
    record.add_argument("--output-dir", default="")
    record.add_argument("--split-size", type=int, default=0, help="bytes; 0: no size split")
    record.add_argument("--split-duration", type=float, default=0.0, help="s; 0: no duration split")
    record.add_argument("--compress", action="store_true", help="zstd chunk compression")
    record.add_argument("--duration", type=float, default=0.0, help="s; stop after this long (0: Ctrl-C)")
    info = sub.add_parser("info", help="topics, counts, drops and session metadata of a bag")
    info.add_argument("bag")
    info.add_argument("--json", action="store_true")
    repair = sub.add_parser("repair", help="recover a bag the recorder could not finalize")
    repair.add_argument("bag")
    args = parser.parse_args(argv)
    try:
        return {"record": _record, "info": _info, "repair": _repair}[args.command](args)
    except (BagError, RepairError, OptionError, NotMcapError, OSError) as error:
        print(f"twinloop bag: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
