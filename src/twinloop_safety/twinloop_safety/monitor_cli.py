"""twinloop monitor: arm, disarm, reset the envelope monitor; its status.

    twinloop monitor status                          # state, latched fault and reason, command counts
    twinloop monitor arm                             # forward safe commands to /joint_command
    twinloop monitor disarm                          # forward nothing; the robot holds where it is
    twinloop monitor reset --note "checked the cell" # clear a latched fault (the monitor re-arms)

Talks to the running envelope monitor (`--monitor`, default /envelope_monitor) on
$ROS_DOMAIN_ID through twinloop_ros.clients.EnvelopeClient. Each command prints the
monitor's state after it. `arm` is refused while a fault is latched or joint states are
stale; `reset` is refused while joint states are stale or the external force is still over
its limit (the monitor's reason is printed).

Exit codes: 0 done; 2 bad arguments; 3 the monitor is not running on this ROS_DOMAIN_ID,
did not answer, or refused (the reason is printed); 130 interrupted by Ctrl-C.
"""
from __future__ import annotations

import argparse
import sys
import time

from twinloop_interfaces.msg import EnvelopeStatus

from twinloop_ros.clients import FAULT_NAMES, STATE_NAMES, EnvelopeClient, describe_envelope
from twinloop_ros.command_line import run_live

PROG = "twinloop monitor"


def _status(monitor: EnvelopeClient, args) -> int:
    print(describe_envelope(monitor.wait_for_status(args.timeout)))
    return 0


def _set_armed(monitor: EnvelopeClient, args, armed: bool) -> int:
    response = monitor.set_armed(armed, args.timeout)
    status = _fresh_status(monitor, response.state)
    print(describe_envelope(status) if status else STATE_NAMES.get(response.state, str(response.state)))
    return 0


def _reset(monitor: EnvelopeClient, args) -> int:
    response = monitor.reset_fault(args.timeout, note=args.note)
    if response.cleared_fault == EnvelopeStatus.FAULT_NONE:
        print("no fault was latched")
    else:
        print(f"cleared fault {FAULT_NAMES.get(response.cleared_fault, response.cleared_fault)}")
    status = _fresh_status(monitor, None)
    print(describe_envelope(status) if status else "no status from the monitor yet")
    return 0


def _fresh_status(monitor: EnvelopeClient, state: int | None, wait_s: float = 1.0) -> EnvelopeStatus | None:
    """The latched status once it shows `state` (after a reset: any state but FAULT); the
    monitor publishes it as it answers, on another topic, so it may arrive a moment later."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        status = monitor.status
        if status is not None and (status.state == state if state is not None
                                   else status.state != EnvelopeStatus.STATE_FAULT):
            return status
        time.sleep(0.01)
    return monitor.status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--monitor", default="/envelope_monitor", help="node name of the envelope monitor")
    parser.add_argument("--timeout", type=float, default=5.0, help="s to wait for the monitor to answer")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="state, latched fault and reason, commands forwarded and rejected")
    sub.add_parser("arm", help="forward safe commands from the twinloop command topics")
    sub.add_parser("disarm", help="forward nothing (the robot holds its measured position)")
    reset = sub.add_parser("reset", help="clear a latched fault after checking the cell (the monitor re-arms)")
    reset.add_argument("--note", default="", help="operator note, logged by the monitor")
    args = parser.parse_args(argv)

    def body(session) -> int:
        monitor = EnvelopeClient(session.node, monitor=args.monitor)
        if args.command == "status":
            return _status(monitor, args)
        if args.command == "reset":
            return _reset(monitor, args)
        return _set_armed(monitor, args, args.command == "arm")

    return run_live(PROG, body)


if __name__ == "__main__":
    sys.exit(main())
