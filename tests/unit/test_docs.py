"""The docs a user reads: README.md stays a short door, docs/ builds as an MkDocs site.

    mkdocs build --strict   every page builds, every internal link and anchor resolves
    README.md               at most 15,000 bytes; every relative link points to a file
    mkdocs.yml nav          lists every page under docs/ (none is left unreachable)
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
README_LIMIT = 15_000

# [text](target) and ![alt](target); the target ends at whitespace or ')'
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def markdown_links(text: str) -> list[str]:
    """Link targets of a Markdown text, leaving out code blocks and code spans."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return LINK.findall(text)


def relative_link_problems(md: Path) -> list[str]:
    problems = []
    for target in markdown_links(md.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http:, https:, mailto: ...; an anchor of the page itself
        path = target.split("#", 1)[0].split("?", 1)[0]
        if not (md.parent / path).exists():
            problems.append(f"{md.name}: link to {target!r}: no such file")
    return problems


def nav_pages(nav) -> list[str]:
    """Every page path in an mkdocs `nav` (a nested list of strings and {title: ...} mappings)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    return []


def load_mkdocs_config() -> dict:
    # mkdocs.yml may hold !ENV / !!python tags; a plain loader that ignores unknown tags is enough
    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    return yaml.load((REPO / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)


def test_mkdocs_builds_strict(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}{proc.stderr}"
    assert (site / "index.html").is_file(), f"no index.html in {sorted(p.name for p in site.iterdir())}"


def test_readme_is_short():
    size = (REPO / "README.md").stat().st_size
    assert size <= README_LIMIT, (f"README.md is {size} bytes, over {README_LIMIT}: keep it the door "
                                  f"(commands, adding a model, outputs) and move depth to docs/")


def test_every_docs_page_is_in_the_nav():
    config = load_mkdocs_config()
    docs_dir = REPO / config.get("docs_dir", "docs")
    listed = set(nav_pages(config.get("nav")))
    pages = {p.relative_to(docs_dir).as_posix() for p in docs_dir.rglob("*.md")}
    assert pages, f"no pages under {docs_dir}"
    missing = sorted(pages - listed)
    assert not missing, f"pages under {docs_dir.name}/ not in mkdocs.yml's nav: {missing}"
    dangling = sorted(listed - pages)
    assert not dangling, f"mkdocs.yml's nav names pages that do not exist: {dangling}"


def test_readme_relative_links_point_to_files():
    problems = relative_link_problems(REPO / "README.md")
    assert not problems, "\n".join(problems)


def test_link_checker_sees_a_broken_link(tmp_path):
    """The link test above relies on this walk: it must report a missing file, and skip URLs,
    anchors and links inside code."""
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a) [web](https://pydoit.org) [self](#top)\n"
                    "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
                    "[broken](missing/file.md)\n")
    assert relative_link_problems(page) == ["page.md: link to 'missing/file.md': no such file"]
