"""One task as an operator is shown it, read from the store: what ``meshpoint tasks
show`` prints and the dashboard's task page renders (:func:`task_details`), so the
two never tell a task differently.

A live task (it has rows) is read from its live row, its sub-tasks and its history:
its status, what it waits on (peers and approvals, with their deadlines), who
answered what, the last turns of its conversation, its iterations and a workflow
agent's progress. A task that ended is read from its verified history. A live task
whose history fails verification is still shown, marked unverified. With
``sealed_ok``, a live task whose checkpoint is sealed under a key this process does
not hold is shown from its clear columns (:func:`sealed_details`) instead of raising.
"""

from __future__ import annotations

from typing import Any

from meshpoint.errors import (
    HistoryIntegrityError,
    MeshpointError,
    UnknownTaskError,
    UnreadableValueError,
)
from meshpoint.store.results import SubTask


async def task_details(store: Any, task_id: str, *, turns: int = 6,
                       schemas: bool = False, sealed_ok: bool = False) -> dict[str, Any]:
    """The task as a dict of plain values (see the module docstring); UnknownTaskError
    for a task the tenant has neither live rows nor history of (another tenant's
    tasks are unknown). ``schemas``: each pending approval carries its tool's JSON
    schema (``parameters``), which a form of its arguments is built from.
    ``sealed_ok``: a checkpoint sealed under a key not held is shown sealed (its
    ``sealed`` says why) instead of raising UnreadableValueError."""
    from meshpoint.cli.ended import ending_of
    from meshpoint.cli.handoffs import history_of, iterations
    from meshpoint.cli.workflows import live_workflow, workflow_of
    from meshpoint.runtime.approvals import APPROVAL, as_decision, describe

    integrity = None
    try:
        try:
            restored = await store.restore_task(task_id)
        except UnreadableValueError:
            raise
        except HistoryIntegrityError as error:
            # A task whose history fails verification (a blocked one, say) is still
            # shown, so an operator can judge it, marked unverified; its live row's
            # own checksum is still checked.
            integrity = str(error)
            restored = await store.restore_task(task_id, verify=False)
    except UnreadableValueError as error:
        if not sealed_ok:
            raise
        return await sealed_details(store, task_id, str(error), error)
    except UnknownTaskError:
        # Ended, or never known: its history (verified) says which.
        records = await history_of(store, task_id)
        if not records:
            raise
        return {"task_id": task_id, "agent": records[-1].metadata.agent_id,
                **ending_of(records[-1]), "live": False,
                "checkpointed_at": None,
                "lease_owner": None, "waiting_on": [], "answered": [],
                "conversation": [], "verified": True, "integrity_error": None,
                "iterations": iterations(records),
                "workflow": workflow_of(records[-1].execution_state)}
    rows: list[dict[str, Any]] | None = None
    if integrity is None:
        try:
            rows = iterations(await history_of(store, task_id))
        except MeshpointError:  # the live row still shows; `verify` tells why
            rows = None
    subs = await store.get_peer_sub_tasks_for_task(task_id)
    ctx = restored.context
    waiting, answered = [], list(ctx.flags.get("approvals") or [])
    for sub in subs:
        corr = sub.correlation_data
        if sub.status != "pending":
            if isinstance(corr.get(APPROVAL), dict):
                answered.append({"tool": corr[APPROVAL]["tool"],
                                 **as_decision(sub.result)})
            continue
        item = (describe(sub.sub_task_id, corr) if isinstance(corr.get(APPROVAL), dict)
                else {"call_id": sub.sub_task_id, "peer": sub.peer_agent_name,
                      "query": corr.get("query")})
        if schemas and "tool" in item:
            item["parameters"] = corr[APPROVAL].get("parameters") or {}
        waiting.append({**item, "kind": "approval" if "tool" in item else "peer",
                        "deadline": timeout_at(sub, restored.checkpointed_at)})
    return {"task_id": task_id, "agent": restored.agent_name, "status": restored.status,
            "live": True, "checkpointed_at": restored.checkpointed_at,
            "lease_owner": restored.owner,
            "waiting_on": waiting, "answered": answered,
            "conversation": ctx.session_events[-turns:] if turns else [],
            "verified": integrity is None, "integrity_error": integrity,
            "iterations": rows, "workflow": live_workflow(ctx, subs)}


async def sealed_details(store: Any, task_id: str, why: str,
                         error: Exception) -> dict[str, Any]:
    """A live task whose checkpoint cannot be opened here (sealed under a key this
    process does not hold), from what is stored in clear: its status, agent, lease
    and checkpoint time (its row of ``tasks_page``), its open calls with their
    deadlines (an approval's tool and arguments only when they are not sealed), and
    its iterations; ``sealed`` says why the rest is not shown. ``error`` is raised
    again when the task has no live row."""
    from meshpoint.cli.handoffs import history_of, iterations
    from meshpoint.runtime.approvals import APPROVAL, describe

    found = await store.tasks_page(prefix=task_id, limit=1)  # the id sorts first
    if not found or found[0].task_id != task_id:
        raise error
    row = found[0]
    waiting = []
    for sub in await store.get_peer_sub_tasks_for_task(task_id):
        corr = sub.correlation_data if isinstance(sub.correlation_data, dict) else {}
        if sub.status != "pending":
            continue
        if isinstance(corr.get(APPROVAL), dict):
            item = {**describe(sub.sub_task_id, corr), "kind": "approval"}
        else:
            item = {"call_id": sub.sub_task_id, "peer": sub.peer_agent_name,
                    "query": corr.get("query"), "kind": "peer"}
            if not isinstance(item["query"], str) or "$unreadable" in corr:
                item["query"] = "(sealed: no key to read it)"
        waiting.append({**item, "deadline": timeout_at(sub, row.checkpointed_at)})
    try:
        rows: list[dict[str, Any]] | None = iterations(await history_of(store, task_id))
    except MeshpointError:
        rows = None
    return {"task_id": task_id, "agent": row.agent_name, "status": row.status,
            "live": True, "checkpointed_at": row.checkpointed_at,
            "lease_owner": row.owner, "waiting_on": waiting, "answered": [],
            "conversation": [], "verified": True, "integrity_error": None,
            "iterations": rows, "workflow": None, "sealed": why}


def timeout_at(sub: SubTask, checkpointed_at: float) -> float:
    """When a pending call times out. Its stored deadline may still be its
    announcement check (``announce_check_s``, earlier than its timeout: the sweeper
    publishes it again then), which is not when it times out."""
    timeout_s = sub.correlation_data.get("timeout_s")
    if isinstance(timeout_s, int | float) and "announce_check_s" in sub.correlation_data \
            and sub.timeout_deadline < checkpointed_at + timeout_s - 0.001:
        return checkpointed_at + float(timeout_s)
    return sub.timeout_deadline
