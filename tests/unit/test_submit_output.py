"""What ``meshpoint submit`` prints at a pause (:class:`meshpoint.cli.submitting.Reporter`):
commands a shell runs as printed, whatever the config's path or the model's arguments."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from meshpoint.cli.submitting import Reporter
from meshpoint.serve import Submitted

SENT = Submitted("assistant-0123", "r1", "assistant", "shop")
CALL = {"call_id": "c1", "tool": "refund", "arguments": {"order": "1042", "note": "\x1b[2J"}}


def test_a_pause_is_told_with_commands_that_survive_a_shell(
        capsys: pytest.CaptureFixture[str]) -> None:
    reporter = Reporter(Path("my deploy/mesh.yaml"), as_json=False, no_wait=False)
    reporter.submitted(SENT)
    reporter.input_required(SENT, [CALL])
    err = capsys.readouterr().err.splitlines()
    assert all(line.startswith("assistant-0123: ") for line in err), err
    assert "\x1b" not in "".join(err)  # the model's arguments never reach the terminal raw
    approve = next(line for line in err if "approve:" in line).split("approve: ")[1]
    assert shlex.split(approve) == ["meshpoint", "tasks", "approve", "assistant-0123", "c1",
                                    "--config", "my deploy/mesh.yaml"]


def test_with_approvers_the_commands_ask_for_the_signer(
        capsys: pytest.CaptureFixture[str]) -> None:
    reporter = Reporter(Path("mesh.yaml"), as_json=True, no_wait=False)
    reporter.approvers = ["cfo"]
    reporter.submitted(SENT)
    reporter.input_required(SENT, [CALL])
    submitted, pause = map(json.loads, capsys.readouterr().out.splitlines())
    assert submitted == {"event": "submitted", "task_id": "assistant-0123", "request_id": "r1",
                         "agent": "assistant", "namespace": "shop"}
    [call] = pause["pending"]
    assert call["arguments"] == CALL["arguments"]
    assert shlex.split(call["deny"]) == [
        "meshpoint", "tasks", "deny", "assistant-0123", "c1", "--reason", "REASON", "--by",
        "APPROVER", "--key", "file:KEY", "--config", "mesh.yaml"]
    assert "--by APPROVER" in pause["reply"]


def test_no_wait_prints_the_task_id_alone_on_stdout(
        capsys: pytest.CaptureFixture[str]) -> None:
    Reporter(Path("mesh.yaml"), as_json=False, no_wait=True).submitted(SENT)
    out, err = capsys.readouterr()
    assert out == "assistant-0123\n"
    assert err.startswith("assistant-0123: submitted to agent assistant (namespace shop); "
                          "follow it with: meshpoint tasks show assistant-0123 --config")
