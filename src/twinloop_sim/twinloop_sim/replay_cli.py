"""twinloop replay: replay a recorded run in a twin version and report how well it predicts.

    twinloop replay bags/<trial bag> --twin twins/emulated/v3 [--output-dir replays] [--report-only]

The twin's response is written as the bag <output-dir>/<bag>-replay-v<N> (topics under
/twinloop/sim/; <output-dir> is replays/ in the working directory unless given, as for the
replay server), never over an existing one; --report-only prints the comparison and writes
nothing. This command runs offline: the RViz ghost (/twinloop/sim/joint_states, live) comes
from the replay server's action (replay.launch.py, `twinloop bringup`).
Exit codes: 0 done; 2 bad input (a bag that cannot be read or replayed, a twin that does
not load or verify, an existing response bag; one line on stderr says what is wrong and
what to do).
"""
from __future__ import annotations

import argparse
import sys

from twinloop_sim.replay import ReplayError, format_report, replay_bag
from twinloop_twin.bundle import TwinError

DEFAULT_OUTPUT_DIR = "replays"  # the replay server's default output_dir too


def one_line(error: BaseException) -> str:
    """A multi-line message (a twin's list of mismatched files) on one line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "".join(line if not i else (" " if lines[i - 1].endswith(":") else "; ") + line
                   for i, line in enumerate(lines)) or type(error).__name__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop replay", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("bag", help="recorded bag (rosbag2 folder) with /joint_states and /joint_command")
    parser.add_argument("--twin", required=True, help="twin version folder, e.g. twins/emulated/v0")
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR,
                        help="folder of the twin's response bag (default: %(default)s)")
    parser.add_argument("--report-only", action="store_true", help="print the comparison, write no response bag")
    args = parser.parse_args(argv)
    if not args.output_dir and not args.report_only:
        parser.error("--output-dir is empty; give a folder, or --report-only to write no response bag")
    try:
        result, output = replay_bag(args.bag, args.twin, None if args.report_only else args.output_dir,
                                    progress=lambda f, text: print(f"[{f * 100:3.0f}%] {text}", flush=True))
    except (ReplayError, TwinError, OSError) as error:
        print(f"twinloop replay: error: {one_line(error)}", file=sys.stderr)
        return 2
    print(format_report(result))
    if output:
        print(f"twin response: {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
