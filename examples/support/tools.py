"""The support agent's own tools: plain functions, named in mesh.yaml as
``tools:lookup_order`` and ``tools:refund``. ``meshpoint serve`` finds this file
because it sits next to mesh.yaml.

``refund`` has consequences, so mesh.yaml makes every call wait for a human's
approval, and checkpoints after it ran (``after_tools``): a process killed later in
the turn does not refund twice. It writes one line per refund to a ledger file, so
that you (and the example's test) can count them; a real one would pass
``call.idempotency_key`` to the payment API, which refuses a second refund with it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from meshpoint.runtime import ToolCallInfo

ORDERS = {
    "A-1001": {"item": "espresso machine", "paid_cents": 24900, "status": "delivered"},
    "A-1002": {"item": "grinder", "paid_cents": 8900, "status": "delivered, damaged"},
    "A-1003": {"item": "kettle", "paid_cents": 3900, "status": "in transit"},
}


def ledger() -> Path:
    """Where refunds are written: $SUPPORT_LEDGER, or refunds.jsonl in the directory
    the processes run in."""
    return Path(os.environ.get("SUPPORT_LEDGER", "refunds.jsonl"))


def lookup_order(args: dict[str, Any]) -> dict[str, Any]:
    """Look an order up by its id (A-1001 ...): item, amount paid, status."""
    order = ORDERS.get(args["order_id"])
    if order is None:
        raise LookupError(f"no order {args['order_id']!r}")  # the model is shown the error
    return {"order_id": args["order_id"], **order}


def refund(args: dict[str, Any], call: ToolCallInfo) -> str:
    """Refund an amount (in cents) of an order to the customer."""
    order = ORDERS.get(args["order_id"])
    if order is None:
        raise LookupError(f"no order {args['order_id']!r}")
    if args["amount_cents"] > order["paid_cents"]:
        raise ValueError(f"{args['amount_cents']} cents is more than the "
                         f"{order['paid_cents']} paid")
    with ledger().open("a") as out:
        out.write(json.dumps({"order_id": args["order_id"],
                              "amount_cents": args["amount_cents"],
                              "idempotency_key": call.idempotency_key}) + "\n")
    return f"refunded {args['amount_cents']} cents of order {args['order_id']}"
