"""`verifierd alarms clear ALARM_ID --reason TEXT`: clear a prover alarm (admin; audited).

An alarm is raised when a prover's sequential test crosses its bound (DISHONEST) or its
unverifiable share for one reason exceeds its configured rate (HIDING); `verifierd provers
list` and `show` name them. It stays in force, across restarts too, until an admin clears
it with a reason: the alarm is kept, marked with who cleared it, when and why, and the
audit log gets a `clear_prover_alarm` event. Clearing a DISHONEST alarm restarts that
prover's test for the commitment; a HIDING alarm is raised again while the prover still
hides. Connection options as in `verifierd verdicts`; exit 1 when refused (not admin, no
such alarm in force).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from verifierd.client_options import connection_parser
from verifierd.commands.provers import alarm_lines, call_verifier


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "alarms",
        help="clear a prover alarm (admin; audited)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="alarms_action", metavar="ACTION", required=True)
    clear = actions.add_parser(
        "clear", parents=[connection_parser(timeout_s=30.0)], help="clear one alarm in force"
    )
    clear.add_argument("alarm_id", help="the alarm's id (32 hex digits)")
    clear.add_argument("--reason", required=True, help="why (kept in the audit log)")
    clear.set_defaults(func=lambda args: call_verifier(args, "verifierd alarms clear", _clear))


async def _clear(stub: verifier_pb2_grpc.VerifierServiceAsyncStub, args: argparse.Namespace) -> int:
    request = verifier_pb2.ClearAlarmRequest(alarm_id=args.alarm_id, reason=args.reason)
    response = await stub.ClearAlarm(request, timeout=args.timeout)
    sys.stdout.write("\n".join(["cleared", *alarm_lines(response.cleared)]) + "\n")
    return 0
