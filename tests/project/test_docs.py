"""The README is a front door and the docs site holds the rest: the site builds with warnings as errors
(Sphinx + MyST, ``docs/``), every relative link of the README and the docs pages resolves (files and
``#anchor``s, GitHub-style heading slugs), external links are the listed ones (never fetched: no internet),
and the README stays short and carries the blocks of the guides verbatim."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

from _docs import ROOT, doc_section, fenced_blocks, headings, markdown_pages

README = ROOT / "README.md"
README_MAX_LINES = 250
QUICKSTART = [
    "bash setup.sh && .venv/bin/energon-pack demo",
    "bash setup.sh --test && .venv/bin/python -m pytest -q -n 2 --dist loadfile",
]
#: every external link of the README and the docs; a new one is added here on purpose (they are not fetched)
EXTERNAL_LINKS = {"https://github.com/NVIDIA/Megatron-Energon"}
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def prose(text: str) -> str:
    """``text`` without fenced code blocks, inline code and HTML comments (links there are not links)."""
    kept, fence = [], None
    for line in text.splitlines():
        marker = re.match(r"^(```+|~~~+)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)
            elif line.startswith(fence) and not line[len(fence) :].strip():
                fence = None
            continue
        if fence is None:
            kept.append(line)
    out = re.sub(r"<!--.*?-->", "", "\n".join(kept), flags=re.S)
    return re.sub(r"(`+)(?:(?!\1).)+?\1", "", out)


def github_slug(title: str) -> str:
    """GitHub's heading anchor: lower case, markup and punctuation dropped (``-`` and ``_`` kept),
    spaces to ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)  # a link's text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page (duplicates numbered as GitHub does)."""
    seen: dict[str, int] = {}
    out = set()
    for _, _, title in headings(page.read_text()):
        slug = github_slug(title)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def relative_link_problems(page: Path) -> list[str]:
    problems = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / unquote(path)).resolve() if path else page
        where = f"{page.relative_to(ROOT)}: {target}"
        if not resolved.exists():
            problems.append(f"{where}: no file {resolved}")
        elif not resolved.is_relative_to(ROOT):
            problems.append(f"{where}: outside the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{where}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
        elif anchor and resolved.suffix != ".md":
            problems.append(f"{where}: an anchor into a non-Markdown file")
    return problems


# ------------------------------------------------------------------------------ the README
def test_readme_is_a_short_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_readme_quickstart_holds_exactly_the_two_commands():
    blocks = fenced_blocks(README.read_text(), "bash")
    assert [line for line in blocks[0][1].splitlines() if line.strip()] == QUICKSTART
    assert "pip install energon-pack" not in README.read_text()  # there is no package on PyPI


def test_readme_python_blocks_are_the_guides_blocks_verbatim():
    """The README's examples are copies of the guides' (where the tests execute them): one text, two places."""
    docs_code = {code for page in markdown_pages()[1:] for _, code in fenced_blocks(page.read_text(), "python")}
    readme_code = [code for _, code in fenced_blocks(README.read_text(), "python")]
    assert readme_code and all(code in docs_code for code in readme_code)


def test_convert_skip_reasons_table_says_what_the_code_says():
    """The data guide's skip-reason table is the convert command's own ``SKIP_REASONS``, row for row."""
    from energon_pack.cli.convert.summary import SKIP_REASONS

    section = doc_section("docs/guides/your_data.md", "Skip reasons")
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    table = {reason.strip("| `"): html.unescape(meaning.rstrip(" |")) for reason, meaning in rows}
    assert table == SKIP_REASONS


# ------------------------------------------------------------------------------ links
def test_the_slug_rule_matches_github():
    assert github_slug("Offline packs for Bridge: `energon-pack pack-offline`") == (
        "offline-packs-for-bridge-energon-pack-pack-offline"
    )
    assert github_slug("What `check_bridge_config` enforces") == "what-check_bridge_config-enforces"
    assert github_slug("GPT-SFT JSONL with Bridge's GPT step") == "gpt-sft-jsonl-with-bridges-gpt-step"


def test_link_finder_skips_code_and_sees_images():
    text = "see [a](x.md#b) and ![p](../p.png)\n`[c](no.md)`\n```\n[d](no.md)\n```\n<!-- [e](no.md) -->\n"
    page = ROOT / "docs" / "probe.md"
    assert LINK.findall(prose(text)) == ["x.md#b", "../p.png"] and page.parent.exists()


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert not relative_link_problems(page)


def test_every_benchmark_output_is_linked():
    """Each JSON result and plot in docs/ is linked from a page, so every number has its source in reach."""
    linked = {
        (page.parent / unquote(target.partition("#")[0])).resolve()
        for page in markdown_pages()
        for target in links(page)
    }
    outputs = {p.resolve() for p in (ROOT / "docs").iterdir() if p.suffix in (".json", ".png")}
    assert outputs and not sorted(p.name for p in outputs - linked)


def test_external_links_are_the_listed_ones():
    found = {target for page in markdown_pages() for target in links(page) if re.match(r"^[a-z]+:", target)}
    assert found == EXTERNAL_LINKS, sorted(found ^ EXTERNAL_LINKS)


def test_every_docs_page_is_in_the_site():
    """Each page is reachable from a toctree (Sphinx -W refuses orphans too; this names the page at once)."""
    pages = {
        p.relative_to(ROOT / "docs").with_suffix("").as_posix()
        for p in (ROOT / "docs").rglob("*.md")
        if not p.name.startswith("_")
    }
    listed = {"index"}
    for p in (ROOT / "docs").rglob("*.md"):
        for block in re.findall(r"```\{toctree\}\n(.*?)```", p.read_text(), re.S):
            base = p.parent.relative_to(ROOT / "docs")
            for entry in block.splitlines():
                if entry.strip() and not entry.startswith(":"):
                    listed.add((base / entry.strip()).as_posix())
    assert pages == listed, sorted(pages ^ listed)


# ------------------------------------------------------------------------------ the site
@pytest.fixture(scope="module")
def site(tmp_path_factory):
    import importlib.util

    missing = [m for m in ("sphinx", "myst_parser", "furo", "sphinxarg") if importlib.util.find_spec(m) is None]
    if missing:  # a failure, not a skip: the site must build in every test run
        pytest.fail(f"the docs extra is not installed ({missing}): `bash setup.sh --test` installs it")
    out = tmp_path_factory.mktemp("docs_html")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(ROOT / "docs"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return proc, out


def test_site_builds_with_warnings_as_errors(site):
    proc, out = site
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr[-5000:]
    assert (out / "index.html").is_file() and (out / "guides" / "quickstart.html").is_file()


def test_api_reference_documents_every_public_name(site):
    import energon_pack

    _, out = site
    ids = set(re.findall(r'id="(energon_pack\.[\w.]+)"', (out / "reference" / "api.html").read_text()))
    missing = [name for name in energon_pack.__all__ if not any(i.rsplit(".", 1)[-1] == name for i in ids)]
    assert not missing


def test_cli_reference_comes_from_the_parser(site):
    from energon_pack.cli.main import build_parser

    _, out = site
    html = (out / "reference" / "cli.html").read_text()
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert len(commands) >= 10 and all(f'id="energon-pack-{name}"' in html for name in commands)
    assert 'id="energon-pack-convert-positional-arguments"' in html and "--image-root" in html  # its own parser
