"""Sphinx configuration of the energon_pack docs site (MyST Markdown pages, as Megatron-Energon's docs).

Build: ``.venv/bin/sphinx-build -W --keep-going -b html docs /tmp/docs_html`` (tests/project/test_docs.py runs it).
The API reference (``reference/api.md``) is completed at build time from ``energon_pack._EXPORTS``, so every
public name is documented from its docstring and none is forgotten when the public face grows.
"""

import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _cli_parser, for sphinx-argparse

import energon_pack  # noqa: E402

project = "energon_pack"
author = "energon_pack contributors"
copyright = f"2026, {author}"
release = version = energon_pack.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinxarg.ext",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
# files starting with "_" are included by pages (the raw table `energon-pack bench` writes), not pages
exclude_patterns = ["_build", "**/_*.md"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # `page.md#a-heading` links resolve to GitHub-style slugs, as in the README

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # signatures stay readable; the Args: sections say the types
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"energon_pack {release}"

API_PAGE = "reference/api"
#: classes whose methods are part of the public face
CLASS_MEMBERS = {"OnlinePacker": "push, pop_skipped, flush, state_dict"}


def _defining_module(name: str, exported_from: str) -> str:
    """The module whose source assigns ``name`` at top level (where autodoc finds its ``#:`` comment)."""
    package = ROOT / Path(*exported_from.split("."))
    files = sorted(package.rglob("*.py")) if package.is_dir() else [package.with_suffix(".py")]
    for path in files:
        if re.search(rf"(?m)^{name}\s*[:=]", path.read_text()):
            parts = path.relative_to(ROOT).with_suffix("").parts
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return exported_from


def _data_entry(name: str, exported_from: str) -> list[str]:
    from sphinx.pycode import ModuleAnalyzer

    module = _defining_module(name, exported_from)
    if ("", name) in ModuleAnalyzer.for_module(module).find_attr_docs():
        return [f".. autodata:: {module}.{name}", "   :no-value:"]
    kind = type(getattr(energon_pack, name)).__name__
    return [f".. py:data:: energon_pack.{name}", "", f"   A ``{kind}``, defined in ``{module}``."]


def api_entries() -> str:
    """One autodoc entry per public name, in ``_EXPORTS`` order, under its comment as a heading."""
    source = (ROOT / "energon_pack" / "__init__.py").read_text()
    block = source[source.index("_EXPORTS: dict") : source.index("__all__ =")]
    out = []
    for line in block.splitlines():
        if comment := re.match(r"\s+# (.+)", line):
            title = comment.group(1)
            out += [f"## {title[0].upper()}{title[1:]}", ""]
        elif entry := re.match(r'\s+"(\w+)": "([\w.]+)"', line):
            name, module = entry.groups()
            value = getattr(energon_pack, name)
            if inspect.isclass(value):
                rst = [f".. autoclass:: energon_pack.{name}"]
                if name in CLASS_MEMBERS:
                    rst.append(f"   :members: {CLASS_MEMBERS[name]}")
            elif callable(value):
                rst = [f".. autofunction:: energon_pack.{name}"]
            else:
                rst = _data_entry(name, module)
            out += ["```{eval-rst}", *rst, "```", ""]
    return "\n".join(out)


def _complete_api_page(app, docname: str, source: list[str]) -> None:
    if docname == API_PAGE:
        source[0] = source[0].rstrip() + "\n\n" + api_entries()


def setup(app):
    app.connect("source-read", _complete_api_page)
