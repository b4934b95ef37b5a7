"""A LangGraph graph that stops for a human, started in one process and resumed in
another, through meshpoint's saver (``get_checkpointer``).

    python examples/langgraph_interrupt.py start  --url sqlite:///trip.db --thread t1
    python examples/langgraph_interrupt.py resume --url sqlite:///trip.db --thread t1 \\
        --answer approve

The graph plans a trip (``plan``), asks a human to approve the booking with
``interrupt()`` (``approve``), and books it or not (``book``). ``start`` runs it until
the interrupt and exits: nothing of the run is left in memory, the thread is in the
database. ``resume`` (any process, any host that reaches the database) loads the
thread and continues with ``Command(resume=answer)``: ``plan`` does not run again.
Each prints one JSON line. ``--url`` is any meshpoint store URL (``sqlite:///...`` or
``postgresql+asyncpg://...``, with ``--schema``); tests/acceptance run both.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from meshpoint.integrations.langgraph import get_checkpointer


def _append(left: list[str], right: list[str]) -> list[str]:
    return [*left, *right]


class Trip(TypedDict):
    request: str
    plan: str
    decision: str
    log: Annotated[list[str], _append]


def plan(state: Trip) -> dict[str, Any]:
    return {"plan": f"2 nights in Lisbon for: {state['request']}", "log": ["planned"]}


def approve(state: Trip) -> dict[str, Any]:
    # Stops the run here; the value is what the human is shown. On resume, interrupt()
    # returns the human's answer and the node runs on from this line.
    answer = interrupt({"question": "Book this trip?", "plan": state["plan"]})
    return {"decision": str(answer), "log": [f"human said {answer}"]}


def book(state: Trip) -> dict[str, Any]:
    done = "booked" if state["decision"] == "approve" else "not booked"
    return {"log": [done]}


def build() -> Any:
    graph = StateGraph(Trip)
    graph.add_node("plan", plan)
    graph.add_node("approve", approve)
    graph.add_node("book", book)
    graph.add_edge(START, "plan")
    graph.add_edge("plan", "approve")
    graph.add_edge("approve", "book")
    graph.add_edge("book", END)
    return graph


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=["start", "resume"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--schema", default=None, help="PostgreSQL schema")
    parser.add_argument("--thread", required=True)
    parser.add_argument("--request", default="a quiet hotel near the river")
    parser.add_argument("--answer", default="approve")
    args = parser.parse_args(argv)
    options = {} if args.schema is None else {"schema": args.schema}
    config = {"configurable": {"thread_id": args.thread}}
    with get_checkpointer(args.url, **options) as checkpointer:
        graph = build().compile(checkpointer=checkpointer)
        if args.step == "start":
            result = graph.invoke({"request": args.request, "log": []}, config)
            waiting = [i.value for i in result.get("__interrupt__", [])]
            print(json.dumps({"waiting_for": waiting,
                              "next": list(graph.get_state(config).next)}))
        else:
            if not graph.get_state(config).next:
                print(json.dumps({"error": f"thread {args.thread!r} is not waiting"}))
                return 1
            result = graph.invoke(Command(resume=args.answer), config)
            print(json.dumps({"decision": result["decision"], "log": result["log"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
