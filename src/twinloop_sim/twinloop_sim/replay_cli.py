"""twinloop replay: replay a recorded run in a twin version and report how well it predicts.

    twinloop replay bags/<trial bag> --twin twins/emulated/v3 [--output-dir replays/]
"""
from __future__ import annotations

import argparse
import sys

from twinloop_sim.replay import ReplayError, format_report, replay_bag
from twinloop_twin.bundle import TwinError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bag", help="recorded bag (rosbag2 folder) with /joint_states and /joint_command")
    parser.add_argument("--twin", required=True, help="twin version folder, e.g. twins/emulated/v0")
    parser.add_argument("--output-dir", default="", help="write the twin's response bag here")
    args = parser.parse_args(argv)
    try:
        result, output = replay_bag(args.bag, args.twin, args.output_dir or None,
                                    progress=lambda f, text: print(f"[{f * 100:3.0f}%] {text}", flush=True))
    except (ReplayError, TwinError, FileNotFoundError) as error:
        print(f"twinloop replay: {error}", file=sys.stderr)
        return 2
    print(format_report(result))
    if output:
        print(f"twin response: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
