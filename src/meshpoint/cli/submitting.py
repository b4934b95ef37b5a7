"""What ``meshpoint submit`` prints while it waits: the task id at once, each pause
for a human with the commands that answer it, then the answer.

Plain output keeps stdout for the answer alone (a script reads it as it is) and
tells the rest on stderr, each line starting with the task id, so the lines of
several submits running in one terminal say which task they are about. With
``--json`` every line on stdout is one JSON object (see :class:`Reporter`).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

from meshpoint import a2a
from meshpoint.cli.common import plain
from meshpoint.serve import Submitted


class Reporter:
    """Prints one ``submit``'s progress. JSON lines, with ``--json``:

    * ``{"event": "submitted", "task_id", "request_id", "agent", "namespace"}`` once
      the request is published;
    * ``{"event": "input_required", "task_id", "pending": [...], "reply": command}``
      at each pause for a human, each pending call with its ``call_id``, ``tool``,
      ``arguments`` and the ``approve`` and ``deny`` commands that answer it;
    * at the end the A2A Task (its ``id`` is the task id), or on a timeout
      ``{"error", "kind": "TimeoutError", "task_id"}``.
    """

    def __init__(self, config: Path, *, as_json: bool, no_wait: bool) -> None:
        self.config = config
        self.as_json = as_json
        self.no_wait = no_wait
        #: The mesh's approvers (an answer must then be signed as one of them).
        self.approvers: list[str] = []
        self.task_id: str | None = None

    def submitted(self, sent: Submitted) -> None:
        self.task_id = sent.task_id
        if self.as_json:
            _line({"event": "submitted", "task_id": sent.task_id,
                   "request_id": sent.request_id, "agent": sent.agent,
                   "namespace": sent.namespace})
            return
        if self.no_wait:
            print(sent.task_id, flush=True)
        self._tell(f"submitted to agent {sent.agent} (namespace {sent.namespace})"
                   + ("; follow it with: " + self._command("show", sent.task_id)
                      if self.no_wait else ""))

    def input_required(self, sent: Submitted, pending: list[dict[str, Any]]) -> None:
        calls = [{"call_id": call.get("call_id"), "tool": call.get("tool"),
                  "arguments": call.get("arguments"),
                  "approve": self._command("approve", sent.task_id, call.get("call_id")),
                  "deny": self._command("deny", sent.task_id, call.get("call_id"),
                                        "--reason", "REASON")} for call in pending]
        reply = self._command("reply", sent.task_id, "TEXT")
        if self.as_json:
            _line({"event": "input_required", "task_id": sent.task_id, "pending": calls,
                   "reply": reply})
            return
        self._tell(f"waits for a human to answer {len(calls)} call(s); still waiting "
                   "for its answer")
        for call in calls:
            self._tell(f"  call {plain(call['call_id'])}: {plain(call['tool'])} "
                       f"{json.dumps(call['arguments'], sort_keys=True)}")
            self._tell(f"    approve: {call['approve']}")
            self._tell(f"    deny:    {call['deny']}")
        self._tell(f"  or answer in words: {reply}")

    def answered(self, task: a2a.Task) -> None:
        if self.as_json:  # json.dumps escapes every control character (and all non-ASCII)
            _line(task.model_dump(mode="json", by_alias=True, exclude_none=True))
            return
        state = task.status.state.value
        self._tell(f"ended {state}" + ("; its answer:" if state == "completed" else ""))
        print(plain(answer_text(task)), flush=True)

    def timed_out(self, problem: str) -> None:
        if self.as_json:
            _line({"error": problem, "kind": "TimeoutError", "task_id": self.task_id})
        else:
            self._tell(f"error: {problem}")

    def _tell(self, text: str) -> None:
        """A line on stderr, starting with the task id."""
        print(f"{self.task_id}: {text}", file=sys.stderr, flush=True)

    def _command(self, verb: str, *args: Any) -> str:
        """The ``meshpoint tasks VERB`` command line, quoted for a POSIX shell; with
        approvers, signed as one (``--by`` and ``--key`` to fill in)."""
        signed = ["--by", "APPROVER", "--key", "file:KEY"] \
            if self.approvers and verb != "show" else []
        return shlex.join(["meshpoint", "tasks", verb, *(plain(a) for a in args),
                           *signed, "--config", str(self.config)])


def answer_text(task: a2a.Task) -> str:
    """The words of an answer: the text of its final status message."""
    message = task.status.message
    return "\n".join(part.text for part in (message.parts if message else [])
                     if isinstance(part, a2a.TextPart))


def _line(value: Any) -> None:
    print(json.dumps(value), flush=True)
