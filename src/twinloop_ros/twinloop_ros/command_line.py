"""What every `twinloop` subcommand that drives running nodes shares: a session node, exit
codes, one-line errors, progress lines.

    def main(argv=None) -> int:
        args = parser.parse_args(argv)
        return run_live("twinloop monitor", lambda session: _arm(session, args))

`run_live` opens a `RosSession` on $ROS_DOMAIN_ID, runs the body, and turns a `ClientError`
into one line on stderr and the exit code of `exit_code` (documented as `EXIT_CODES`);
Ctrl-C cancels a running goal (the clients do that) and exits 130.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable, TextIO

from twinloop_interfaces.msg import ErrorCode

from twinloop_ros.clients import ClientError, GoalCanceled
from twinloop_ros.session import RosSession

EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_NOT_RUNNING = 3
EXIT_FAILED = 4
EXIT_CANCELED = 130  # 128 + SIGINT, as shells report an interrupted command

EXIT_CODES = ("Exit codes: 0 done; 2 bad input (the message says what to change); 3 the node is not running "
              "on this ROS_DOMAIN_ID, did not answer, or refused for now (busy, not ready, a latched fault); "
              "4 it ran and failed (the message says why); 130 cancelled by Ctrl-C (a running goal is "
              "cancelled with it).")

# What a subcommand shows when Ctrl-C has sent a cancel request ({node}: who ends the goal).
CANCEL_WAIT = "cancel requested: waiting for {node} to end the goal (Ctrl-C again to stop waiting)"

# ErrorCode groups (twinloop_interfaces/msg/ErrorCode): what the user gave is wrong.
_BAD_INPUT = {ErrorCode.INVALID_ARGUMENT, ErrorCode.SPEC_MISMATCH, ErrorCode.UNKNOWN_JOINT,
              ErrorCode.MALFORMED_COMMAND, ErrorCode.NON_FINITE_COMMAND}
_NOT_RUNNING = {ErrorCode.NOT_READY, ErrorCode.TIMEOUT}


def exit_code(error: ClientError) -> int:
    """The exit code for a failed call: input data and artefacts (100-199, 300-399) and
    invalid arguments are bad input; NOT_READY/TIMEOUT mean the node is not there or not
    ready; anything else failed while running."""
    code = error.code
    if isinstance(error, GoalCanceled) or code == ErrorCode.CANCELED:
        return EXIT_CANCELED
    if code in _NOT_RUNNING:
        return EXIT_NOT_RUNNING
    if code in _BAD_INPUT or 100 <= code < 200 or 300 <= code < 400:
        return EXIT_BAD_INPUT
    return EXIT_FAILED


# A session that has not closed this long after the command's work is done is left behind:
# the process exits with the command's code (one CI run saw a refused `twinloop record start`
# print its error line, then hang in the session's close for the test's 120 s).
CLOSE_TIMEOUT_S = 15.0


def run_live(prog: str, body: Callable[[RosSession], int], *, name: str | None = None) -> int:
    """Run `body(session)` with a session node; errors become one line and an exit code."""
    session = None
    code = EXIT_FAILED
    try:
        session = RosSession(name=(name or prog.replace("twinloop ", "twinloop_").replace(" ", "_"))
                             + f"_{os.getpid()}")
        code = int(body(session) or EXIT_OK)
    except ClientError as error:
        print(f"{prog}: {'cancelled: ' if exit_code(error) == EXIT_CANCELED else 'error: '}{error}",
              file=sys.stderr, flush=True)
        code = exit_code(error)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        code = EXIT_CANCELED
    finally:
        if session is not None:
            close_or_exit(session, code)
    return code


def close_or_exit(session: RosSession, code: int) -> None:
    """Close `session`; if that takes over CLOSE_TIMEOUT_S (or Ctrl-C comes meanwhile), exit
    the process with `code` at once: the command's work and its output are done, and a shell
    must not wait on the middleware's teardown."""
    closer = threading.Thread(target=session.close, daemon=True)
    closer.start()
    try:
        closer.join(CLOSE_TIMEOUT_S)
    except KeyboardInterrupt:
        pass
    if closer.is_alive():  # no line of its own: a refusal stays the one line it printed
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class Progress:
    """Progress lines with the elapsed time, each distinct line once: `progress("arm: 40 %")`."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self.started = time.monotonic()
        self._last = ""

    def __call__(self, text: str) -> None:
        if text == self._last:
            return
        self._last = text
        print(f"[{time.monotonic() - self.started:7.1f} s] {text}", file=self.stream or sys.stderr, flush=True)
