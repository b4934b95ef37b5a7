"""The docs hold together: every relative link in the README, docs/ and examples/
reaches a file that exists and, when it names one, a heading of it; and the pages speak
of the product, not of the issues or design notes it was built from."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "examples" / "README.md",
                *(ROOT / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) or [text](target "title"); images too. Not inside inline code.
_LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """The lines outside fenced code blocks, with their numbers (1-based)."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def slug(heading: str) -> str:
    """A heading's anchor as GitHub renders it: the text without markup, lower case,
    punctuation dropped (word characters, hyphens and spaces kept), spaces as hyphens."""
    text = _CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link: its text
    text = re.sub(r"[*_]{1,3}(\S(?:.*?\S)?)[*_]{1,3}", r"\1", text)  # emphasis
    text = unicodedata.normalize("NFC", text).strip().lower()
    text = "".join(ch for ch in text if ch.isalnum() or ch in "-_ ")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page's headings make, duplicates numbered as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(text):
        match = _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def _prose(text: str) -> str:
    """The page with its fenced code blocks and inline code blanked out, line for line,
    so that a link's offset still gives its line."""
    kept = dict(_prose_lines(text))
    lines = [kept.get(number, "") for number in range(1, len(text.splitlines()) + 1)]
    return _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), "\n".join(lines))


def broken_links(page: Path, text: str | None = None) -> list[str]:
    """Each relative link of ``page`` whose file does not exist, or whose anchor no
    heading of that file makes, as ``page:line: target (why)``. A link's text may run
    over several lines."""
    text = page.read_text() if text is None else text
    prose = _prose(text)
    problems = []
    for match in _LINK.finditer(prose):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        number = prose.count("\n", 0, match.start(1)) + 1
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{where} (no such file)")
            continue
        if not anchor:
            continue
        if dest.suffix != ".md" or dest.is_dir():
            problems.append(f"{where} (an anchor into a file that is not a page)")
        elif anchor not in anchors(text if dest == page else dest.read_text()):
            problems.append(f"{where} (no heading makes this anchor)")
    return problems


def test_every_relative_link_reaches_a_file_and_a_heading() -> None:
    problems = [problem for page in PAGES for problem in broken_links(page)]
    assert problems == [], "broken links:\n" + "\n".join(problems)


def test_the_link_check_finds_a_missing_file_and_a_missing_anchor() -> None:
    """The check itself can fail: a page with a link to no file, to a heading that is
    not there, and to one that is (in the page and in another), in and out of code."""
    page = ROOT / "docs" / "store.md"
    text = ("# A page\n\n## Tenant isolation (PostgreSQL row-level security)\n\n"
            "[ok](#tenant-isolation-postgresql-row-level-security) "
            "[ok](history.md#integrity) [ok](../src/meshpoint/store/)\n"
            "[gone](nowhere.md) [no heading](history.md#no-such-heading)\n"
            "[no heading here](#integrity) `[in code](nowhere-either.md)`\n"
            "```\n[in a block](nowhere-at-all.md)\n```\n"
            "a link [over two\nlines](history.md#nor-this-one) and [ok over\ntwo](#a-page)\n")
    assert broken_links(page, text) == [
        "docs/store.md:6: nowhere.md (no such file)",
        "docs/store.md:6: history.md#no-such-heading (no heading makes this anchor)",
        "docs/store.md:7: #integrity (no heading makes this anchor)",
        "docs/store.md:12: history.md#nor-this-one (no heading makes this anchor)",
    ]


@pytest.mark.parametrize(("heading", "anchor"), [
    ("Real models: `OpenAIModel`, both tool modes, and `make demo-llm`",
     "real-models-openaimodel-both-tool-modes-and-make-demo-llm"),
    ("5. Transport, secrets and terminals", "5-transport-secrets-and-terminals"),
    ("Broker users: each process publishes and reads only its own subjects",
     "broker-users-each-process-publishes-and-reads-only-its-own-subjects"),
    ("The NATS broker (`meshpoint.broker.nats.NatsBroker`)",
     "the-nats-broker-meshpointbrokernatsnatsbroker"),
    ("`@with_logging`", "with_logging"),
])
def test_anchors_are_made_as_github_makes_them(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


# What a page must not cite: an issue by number ("issue 15", "issue-5", "issue13",
# "#27"), the design notes the project was seeded from, which are not in the
# repository (DESIGN.md, "DESIGN §4"); a page may name the seed a design came from
# once, the README not at all.
_ISSUE = re.compile(r"\bissues?[ -]?#?\d+|(?<![\w&/])#\d+\b|(?-i:\bDESIGN\b)(?:\.md)?", re.I)
_SEED = re.compile(r"\bseeds? ?0\d\d\b", re.I)


def citations(text: str) -> tuple[list[str], list[str]]:
    """The issue (and design-note) citations and the seed citations of a page."""
    return _ISSUE.findall(text), _SEED.findall(text)


def test_the_docs_speak_of_the_product_not_of_issue_numbers() -> None:
    problems = []
    for page in PAGES:
        issues, seeds = citations(page.read_text())
        name = str(page.relative_to(ROOT))
        if issues:
            problems.append(f"{name} cites {issues}")
        if len(seeds) > (0 if page.name == "README.md" else 1):
            problems.append(f"{name} cites seeds {len(seeds)} times: {seeds}")
    assert problems == [], "\n".join(problems)


def test_the_citation_check_finds_each_form() -> None:
    text = ("issue 15's target; (issue-5) figures; issue13-before-after.json; see #27; "
            "DESIGN.md §2 and DESIGN §4, a design of its own; seed 001, seeds 000 and 002; "
            "a `&#8203;` entity and the anchor [x](#integrity) are neither")
    issues, seeds = citations(text)
    assert issues == ["issue 15", "issue-5", "issue13", "#27", "DESIGN.md", "DESIGN"]
    assert seeds == ["seed 001", "seeds 000"]
