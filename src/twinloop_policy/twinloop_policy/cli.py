"""twinloop policy: make and inspect policy folders.

    twinloop policy scripted FOLDER [--goal Q1..Q7] [--rate 250] [--timeout 8]

Exit codes: 0 done, 2 bad input (the message says what to do).
"""
from __future__ import annotations

import argparse
import sys

from twinloop_policy import scripted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="twinloop policy", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    scripted.add_arguments(commands.add_parser(
        "scripted", help="write a scripted (untrained) TorchScript policy that drives the arm to a goal"))
    args = parser.parse_args(argv)
    return scripted.run(args)


if __name__ == "__main__":
    sys.exit(main())
