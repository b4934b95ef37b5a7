"""The research pipeline's offline models: deterministic stand-ins for a language
model, one per role, named in mesh.yaml as ``models:offline`` with ``options:
{role: ...}`` (``RESEARCH_MODEL`` unset). Each reads only what its stage is asked,
so the same request always gets the same answer, and it thinks for ``delay_s``
seconds a call, as a model would (time enough to kill a process mid-workflow).

What a stage is asked: the workflow's request, then one ``## <output_key>`` section
per answer so far (docs/workflows.md). The roles:

* ``gatherer``: notes on the request's topic from its ``source``;
* ``writer``: a draft with a point per source it was given;
* ``critic``: asks for sources the first time; once a revision is in front of it,
  it is satisfied and escalates: ``{"escalate": true, "reason": ...}``, which ends
  the loop;
* ``reviser``: the latest draft, with each point's source cited.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from meshpoint.llm.base import ModelResponse, ToolSpec

ROLES = ("gatherer", "writer", "critic", "reviser")
_SECTION = re.compile(r"^## ([A-Za-z_][A-Za-z0-9_]*)$", re.M)


class Offline:
    """A model for one ``role`` (see the module docstring)."""

    def __init__(self, role: str, source: str = "", delay_s: float = 0.0) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        self.name = f"offline-{role}"
        self.role, self.source, self.delay_s = role, source, delay_s

    async def complete(self, messages: list[dict[str, Any]],
                       tools: list[ToolSpec]) -> ModelResponse:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        asked = str(messages[-1].get("content") or "")
        return ModelResponse(text=getattr(self, self.role)(asked), model=self.name)

    def gatherer(self, asked: str) -> str:
        return f"{self.source}: three findings on {topic(asked)}"

    def writer(self, asked: str) -> str:
        points = "\n".join(f"- {finding}" for _, finding in notes(asked))
        return f"# {topic(asked)}\n\n{points}"

    def critic(self, asked: str) -> str:
        if "reviser" in sections(asked):
            return json.dumps({"escalate": True, "reason": "every point cites its source"})
        return "Cite the source of each point."

    def reviser(self, asked: str) -> str:
        found = sections(asked)
        draft = found.get("reviser") or found.get("writer", "")
        sources = iter([source for source, _ in notes(asked)])
        lines = []
        for line in draft.splitlines():
            if line.startswith("- ") and "(source: " not in line:
                line = f"{line} (source: {next(sources, 'unknown')})"
            lines.append(line)
        return "\n".join(lines)


def topic(asked: str) -> str:
    """The request's first line, without a trailing period."""
    return asked.split("\n", 1)[0].strip().rstrip(".")


def sections(asked: str) -> dict[str, str]:
    """The ``## <key>`` sections of what a stage is asked, by key (a later section of
    a key wins), each up to the next title."""
    titles = list(_SECTION.finditer(asked))
    return {title.group(1): asked[title.end():titles[i + 1].start() if i + 1 < len(titles)
                                  else len(asked)].strip()
            for i, title in enumerate(titles)}


def notes(asked: str) -> list[tuple[str, str]]:
    """The gatherers' notes in what a stage is asked, (source, finding) in branch
    order: the lines ``<source>: <finding>`` of the gather stage's answer (its
    branches' sections) up to the writer's section."""
    start = asked.find("## gather\n")
    if start < 0:
        return []
    end = asked.find("## writer\n", start)
    found = []
    for line in asked[start:end if end >= 0 else len(asked)].splitlines():
        source, colon, finding = line.partition(": ")
        if colon and not line.startswith("#"):
            found.append((source, finding))
    return found


def offline(role: str, source: str = "", delay_s: float = 0.0) -> Offline:
    """mesh.yaml's factory: ``{kind: python, factory: models:offline, options:
    {role: ..., source: ..., delay_s: ...}}``."""
    return Offline(role, source, delay_s)
