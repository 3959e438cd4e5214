"""The README is a front door and docs/ the manual: the README stays short, its links and the
docs' links lead somewhere, and its quick start is the one ``plexgt --help`` prints."""

import re
from pathlib import Path

import pytest

from plexgt import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def _one_line(commands: str) -> str:
    """Shell lines with their backslash continuations joined."""
    return re.sub(r"\\\n\s*", "", commands)


def test_readme_is_short_and_names_the_two_commands():
    text = README.read_text()
    assert len(text.splitlines()) <= 120
    assert "make demo" in text and "make test" in text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    for target in LINK.findall(_prose(page.read_text())):
        if re.match(r"\w+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name} links to {target}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", _prose(dest.read_text()), re.M)
            assert anchor in {_slug(h) for h in headings}, f"{page.name}: no heading #{anchor}"


def test_the_readme_links_every_page_of_docs():
    links = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall(README.read_text())}
    assert DOCS and set(DOCS) <= links


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_paragraph_runs_past_eight_lines(page):
    """A paragraph, list item or table row ends at a blank line or the next item."""
    block: list[str] = []
    for line in [*_prose(page.read_text()).splitlines(), ""]:
        if not line.strip() or re.match(r"\s*([-*|]|\d+\.) ", line):
            assert len(block) <= 8, f"{page.name}: {len(block)} lines from {block[0]!r}"
            block = []
        if line.strip():
            block.append(line)


def test_the_quick_start_is_the_one_plexgt_help_prints():
    """The commands of ``plexgt --help``'s epilog are the README's quick start, in order,
    ending with predict."""
    readme = README.read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```bash\n(.*?)^```", quick, re.M | re.S)
    in_readme = [c.strip() for c in _one_line("".join(blocks)).splitlines() if c.strip()]
    _, _, commands = cli.QUICK_START.partition("\n")
    in_help = [c.strip() for c in _one_line(commands).splitlines()]
    assert in_readme == in_help
    assert [c.split()[c.split().index("plexgt") + 1] for c in in_help] == [
        "prep", "plan", "train", "report", "predict"]
