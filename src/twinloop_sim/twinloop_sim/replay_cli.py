"""twinloop replay: replay a recorded run in a twin version and report how well it predicts.

    twinloop replay bags/<trial bag> --twin twins/emulated/v3 [--output-dir replays/]

With --output-dir, the twin's response is written as the bag <output-dir>/<bag>-replay-v<N>,
never over an existing one. Exit codes: 0 done; 2 bad input (a bag that cannot be read or
replayed, a twin that does not load or verify, an existing response bag; one line on
stderr says what is wrong and what to do).
"""
from __future__ import annotations

import argparse
import sys

from twinloop_sim.replay import ReplayError, format_report, replay_bag
from twinloop_twin.bundle import TwinError


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
    parser.add_argument("--output-dir", default="", help="write the twin's response bag here")
    args = parser.parse_args(argv)
    try:
        result, output = replay_bag(args.bag, args.twin, args.output_dir or None,
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
