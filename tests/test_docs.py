"""The docs a newcomer reads hold together: every section a file cites exists, nothing points outside
the repository, the README stays short and maps every package, and each decision record has its parts.

Fast and model-free: it reads files only. Each check is a function over text, and each test also
shows its check reporting a planted defect, so a check that can no longer fail is noticed.
docs/history/ is the dated notebook kept as it was written: it is not checked.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HISTORY = "docs/history/"
CITING_SUFFIXES = (".py", ".md", ".yaml", ".yml")
# Needles built from parts, so that this file does not mention what it looks for.
OUTSIDE = ("DESIGN" + ".md", "../" + "shared")

# A markdown file (or a bare README) followed by a heading in double quotes: after a comma, a space or
# an opening parenthesis. A heading may wrap once.
CITATION = re.compile(
    r"(?P<path>(?<![\w./-])(?:[\w.-]+/)*[\w.-]+\.md|(?<![\w./-])README(?![\w.]))"
    r"(?:,\s*|\s+\(?|\s*\()"
    r"\"(?P<heading>[^\"\n]+(?:\n[^\"\n]+)?)\""
)
# A path under docs/ or bench/ to a markdown file, e.g. a decision record cited by file.
DOC_PATH = re.compile(r"(?<![\w./-])((?:docs|bench)/[\w./-]*?\.md)(?![\w/-])")
DECISION_NAME = re.compile(r"^\d{4}-[a-z0-9]+(?:-[a-z0-9]+)*\.md$")
REQUIRED_SECTIONS = ("Context", "Decision", "Rejected")
# Files whose citations were being changed by another piece of work when these checks were written
# (the fix for each is known), per check; a file leaves its list as soon as it passes, and the test says so.
PENDING: dict[str, dict[str, str]] = {"sections": {}, "paths": {}, "outside": {}}  # file -> why, while one waits


def repo_files() -> list[str]:
    """Tracked files and untracked ones git does not ignore, relative to ROOT; docs/history/ left out."""
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True, timeout=60).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):  # no git (an unpacked source tree): walk it
        skip = {".git", ".venv", ".llmpipe", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
        out = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
               if p.is_file() and not skip.intersection(p.relative_to(ROOT).parts)]
    return sorted(f for f in out if not f.startswith((HISTORY, ".venv/")) and (ROOT / f).is_file())


def headings(markdown: str) -> set[str]:
    """Every heading of a markdown text, any level, without the #s and backticks."""
    return {m.group(1).replace("`", "").strip() for m in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", markdown, re.M)}


def _normal(heading: str) -> str:
    """A cited heading as written in one piece: a line break (and a comment's `#`) read as one space."""
    return re.sub(r"\s*\n\s*#?\s*", " ", heading).replace("`", "").strip()


def _target(path: str, cited_from: str) -> Path | None:
    if path == "README":
        path = "README.md"
    for base in (ROOT, (ROOT / cited_from).parent):
        if (base / path).is_file():
            return base / path
    return None


def citation_problems(text: str, cited_from: str) -> list[str]:
    """Each section citation in `text` whose file or heading does not exist."""
    problems = []
    for m in CITATION.finditer(text):
        path, heading = m.group("path"), _normal(m.group("heading"))
        line = text.count("\n", 0, m.start()) + 1
        target = _target(path, cited_from)
        if target is None:
            problems.append(f"{cited_from}:{line}: cites {path}, which does not exist")
        elif heading not in headings(target.read_text(encoding="utf-8")):
            problems.append(f'{cited_from}:{line}: {path} has no heading "{heading}"')
    return problems


def doc_path_problems(text: str, cited_from: str) -> list[str]:
    """Each docs/... or bench/... markdown path in `text` that names no file."""
    return [f"{cited_from}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(1)} does not exist"
            for m in DOC_PATH.finditer(text) if not (ROOT / m.group(1)).is_file()]


def outside_mentions(data: bytes) -> list[str]:
    return [needle for needle in OUTSIDE if needle.encode() in data]


def readme_problems(readme: str, packages: list[str]) -> list[str]:
    problems = [] if readme.count("\n") <= 170 else [f"README.md has {readme.count(chr(10))} lines (at most 170)"]
    for name in packages:
        if not re.search(rf"(?<![\w/.-])(?:pipeline/)?{re.escape(name)}/", readme):
            problems.append(f"README.md does not name pipeline/{name}/")
    return problems


def decision_problems(name: str, text: str) -> list[str]:
    problems = [] if DECISION_NAME.match(name) else [f"{name}: not named NNNN-title.md"]
    sections = {h for h in re.findall(r"^##[ \t]+(.+?)\s*$", text, re.M)}
    for want in REQUIRED_SECTIONS:
        if not any(h == want or h.startswith(want + " ") for h in sections):
            problems.append(f"{name}: no '## {want}' section")
    return problems


def _text(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8", errors="replace")


def _failing(check: str, problems_of) -> dict[str, list[str]]:
    """file -> its problems, for every file with some; a PENDING file that passes now is reported too."""
    found = {f: problems for f in repo_files() if (problems := problems_of(f))}
    pending = PENDING[check]
    late = {f: [f"passes now: take it off PENDING[{check!r}]"] for f in pending if f not in found}
    return {f: p for f, p in found.items() if f not in pending} | late


def test_every_cited_section_exists():
    found = _failing("sections", lambda f: citation_problems(_text(f), f) if f.endswith(CITING_SUFFIXES) else [])
    assert not found, found
    # the checker itself: a heading nobody wrote, a file that is not there, and a good citation
    design = "docs/design" + ".md"
    assert citation_problems(design + ', "' + "A heading nobody wrote" + '"', "README.md")
    assert citation_problems("docs/no-such-file" + '.md, "Invariants"', "README.md")
    assert citation_problems("README" + ' "' + "No such section" + '"', "tests/test_docs.py")
    assert not citation_problems(design + ',\n' + '"Who may write which topic"', "README.md")
    assert not citation_problems("(" + design + ' ("' + "Invariants" + '")', "README.md")


def test_every_cited_doc_exists():
    cites = (*CITING_SUFFIXES, ".toml", "Dockerfile", "Makefile")
    found = _failing("paths", lambda f: doc_path_problems(_text(f), f) if f.endswith(cites) else [])
    assert not found, found
    assert doc_path_problems("see " + "docs/decisions/9999-nothing" + ".md", "README.md")


def test_nothing_points_outside_the_repository():
    found = _failing("outside", lambda f: outside_mentions((ROOT / f).read_bytes()))
    assert not found, found
    assert outside_mentions(b"the contract (" + OUTSIDE[0].encode() + b")") == [OUTSIDE[0]]


def test_the_readme_is_short_and_maps_every_package():
    packages = sorted(p.name for p in (ROOT / "pipeline").iterdir() if (p / "__init__.py").is_file())
    assert len(packages) >= 10, packages
    readme = _text("README.md")
    assert not readme_problems(readme, packages)
    assert readme_problems(readme, [*packages, "no_such_package"]) == ["README.md does not name pipeline/no_such_package/"]
    assert readme_problems(readme + "\n" * 171, packages)


def test_every_decision_record_has_its_parts():
    records = sorted((ROOT / "docs" / "decisions").glob("*.md"))
    assert len(records) >= 10, records
    found = [p for r in records for p in decision_problems(r.name, r.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)
    numbers = [r.name[:4] for r in records]
    assert len(numbers) == len(set(numbers)), numbers
    assert decision_problems("7-broker.md", "## Context\n## Decision\n") == [
        "7-broker.md: not named NNNN-title.md", "7-broker.md: no '## Rejected' section"]
