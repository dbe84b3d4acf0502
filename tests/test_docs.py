"""The README is a first page a newcomer reads in a few minutes; the rest lives in docs/, and
every link between them leads somewhere. Plain text checks: no kit imports, no processes."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks (a `[x](y)` inside code is code, not a link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(path.read_text(encoding="utf-8")), flags=re.M):
        s = slug(heading)
        found.add(f"{s}-{seen[s]}" if s in seen else s)
        seen[s] = seen.get(s, 0) + 1
    return found


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text(encoding="utf-8")))
            if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto: lead elsewhere


def section(text: str, title: str) -> str:
    return re.split(r"^## ", text.split(f"\n## {title}\n", 1)[1], maxsplit=1, flags=re.M)[0]


def test_the_readme_is_a_first_page_of_at_most_300_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_the_quickstart_is_the_demo_and_the_tests_and_nothing_else():
    quick = section(README.read_text(encoding="utf-8"), "Quickstart")
    block = re.search(r"```\n(.*?)```", quick, flags=re.S).group(1)
    assert block.split("\n")[:-1] == ["./scripts/demo", "./scripts/test"]
    for script in ("demo", "test"):
        assert (ROOT / "scripts" / script).stat().st_mode & 0o111, f"scripts/{script} is not executable"


def test_ci_runs_the_readmes_test_command():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(line.split()[-1:] == ["./scripts/test"] for line in ci if not line.startswith("#"))


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in links(README)}
    pages = sorted(DOCS.glob("*.md"))
    assert pages, "docs/ has no pages"
    assert [p.name for p in pages if p.resolve() not in linked] == []


def test_every_relative_link_in_the_readme_and_docs_leads_to_a_file_and_heading():
    broken = []
    for page in PAGES:
        for target in links(page):
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_emulator_script_points_to_a_readme_section_that_exists():
    script = (ROOT / "scripts" / "kaggle-emulator").read_text(encoding="utf-8")
    named = re.search(r'README: "([^"]+)"', script).group(1)
    assert slug(named) in anchors(README)
