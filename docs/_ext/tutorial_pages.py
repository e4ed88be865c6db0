"""Render the percent-format tutorials (``tutorials/*.py``) as Markdown pages, without running them.

Each ``# %% [markdown]`` cell becomes text (its ``# `` prefixes removed), each ``# %%`` cell a
```` ```python ```` block, and every figure the script saves (``savefig(OUT / "name.png")``) is shown
from ``tutorials/figures/``, the committed output of a full run: where the script's own text already
shows it (``![...](figures/name.png)``) that image is kept, otherwise it follows the cell that saves it.

Elsewhere in the docs, a link to ``tutorials/<name>.py`` (what reads on GitHub) is sent to the
rendered page.

The pages are written to ``docs/tutorials/<name>.md`` on ``builder-inited`` (before Sphinx reads the
sources), only when their text changes, so an incremental build stays incremental. They are build
output (``.gitignore``); ``docs/tutorials/index.md`` is the committed index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tutorials"
TARGET = REPO / "docs" / "tutorials"
#: The order of the index and of the sidebar: the tutorials' letters (a)-(g) in ``tutorials/README.md``.
ORDER = (
    "whvi_from_scratch",
    "nf_whvi",
    "vsd_cnn",
    "iblm",
    "random_features",
    "variational_layers",
    "lightning_ddp",
)
# From a page in docs/tutorials/ to the repository's tutorials/ folder.
UP = "../../tutorials/"

_CELL = re.compile(r"^# %%(?P<kind>.*)$")
_SAVEFIG = re.compile(r"""savefig\(\s*OUT\s*/\s*["'](?P<name>[^"']+\.png)["']""")
_LOCAL_LINK = re.compile(r"\]\((?!https?://|#|/)(?P<path>[^)\s]+)\)")


@dataclass
class Cell:
    kind: str  # "markdown" or "code"
    lines: list[str]


def parse(text: str) -> list[Cell]:
    """Split a percent-format script into cells (text before the first marker is a code cell)."""
    cells: list[Cell] = [Cell("code", [])]
    for line in text.splitlines():
        marker = _CELL.match(line)
        if marker:
            kind = "markdown" if "[markdown]" in marker.group("kind") else "code"
            cells.append(Cell(kind, []))
        else:
            cells[-1].lines.append(line)
    for cell in cells:
        while cell.lines and not cell.lines[0].strip():
            cell.lines.pop(0)
        while cell.lines and not cell.lines[-1].strip():
            cell.lines.pop()
    return [cell for cell in cells if cell.lines]


def _markdown(lines: list[str]) -> str:
    out = []
    for line in lines:
        if line == "#":
            out.append("")
        elif line.startswith("# "):
            out.append(line[2:])
        else:
            raise ValueError(f"a markdown cell line does not start with '# ': {line!r}")
    return _LOCAL_LINK.sub(_relink, "\n".join(out))


def _relink(match: re.Match) -> str:
    """A link relative to tutorials/: another tutorial goes to its page, anything else to the file."""
    path = match.group("path")
    if path.endswith(".py") and "/" not in path and (SOURCE / path).is_file():
        return f"]({path[:-3]}.md)"
    return f"]({UP}{path})"


def render(script: Path) -> str:
    """The Markdown page of one tutorial script."""
    cells = parse(script.read_text(encoding="utf-8"))
    shown = set()
    for cell in cells:
        if cell.kind == "markdown":
            shown.update(re.findall(r"\]\(figures/([^)]+\.png)\)", "\n".join(cell.lines)))
    parts: list[str] = []
    title_done = False
    for cell in cells:
        if cell.kind == "markdown":
            text = _markdown(cell.lines)
            parts.append(text)
            if not title_done and text.lstrip().startswith("# "):
                title_done = True
                parts.append(_banner(script))
        else:
            parts.append("```python\n" + "\n".join(cell.lines) + "\n```")
            for name in _SAVEFIG.findall("\n".join(cell.lines)):
                if name not in shown:
                    figure = SOURCE / "figures" / name
                    if not figure.is_file():
                        raise FileNotFoundError(f"{script.name} saves {name}, which is not in tutorials/figures/")
                    parts.append(f"![{name}]({UP}figures/{name})")
    if not title_done:
        raise ValueError(f"{script.name}: the first markdown cell must start with a '# Title' line")
    return "\n\n".join(parts) + "\n"


def _banner(script: Path) -> str:
    return (
        "```{note}\n"
        f"Rendered from [`tutorials/{script.name}`]({UP}{script.name}) without running it; the figures are the "
        "committed ones in `tutorials/figures/`, from a full run. Run it with "
        f"`python tutorials/{script.name}` (`PYRO_WHVI_TUTORIAL_FAST=1` for the short version the test suite runs).\n"
        "```"
    )


def scripts() -> list[Path]:
    found = {path.stem: path for path in SOURCE.glob("*.py")}
    missing = [name for name in ORDER if name not in found]
    if missing:
        raise FileNotFoundError(f"tutorials listed in docs/_ext/tutorial_pages.py are missing: {missing}")
    extra = sorted(set(found) - set(ORDER))
    return [found[name] for name in (*ORDER, *extra)]


def write_pages(target: Path = TARGET) -> list[Path]:
    """Write (or refresh) every tutorial page; returns the pages' paths."""
    target.mkdir(parents=True, exist_ok=True)
    pages = []
    for script in scripts():
        page = target / f"{script.stem}.md"
        text = render(script)
        if not page.is_file() or page.read_text(encoding="utf-8") != text:
            page.write_text(text, encoding="utf-8")
        pages.append(page)
    return pages


def _builder_inited(app) -> None:
    write_pages()


def _link_scripts_to_pages(app, doctree) -> None:
    """A link to ``tutorials/<name>.py`` (how the docs' Markdown sources link, so that they read on GitHub)
    goes to the tutorial's rendered page; on that page itself it stays a download of the script."""
    from sphinx import addnodes

    docname = app.env.docname
    here = Path(app.env.doc2path(docname)).parent
    for node in list(doctree.findall(addnodes.download_reference)):
        path = (here / node.get("reftarget", "")).resolve()
        if path.parent != SOURCE or path.suffix != ".py" or path.stem not in ORDER:
            continue
        if docname == f"tutorials/{path.stem}":
            continue
        xref = addnodes.pending_xref(
            "",
            *node.children,
            refdomain="std",
            reftype="doc",
            reftarget=f"/tutorials/{path.stem}",
            refexplicit=True,
            refwarn=True,
            refdoc=docname,
        )
        node.replace_self(xref)


def setup(app):
    app.connect("builder-inited", _builder_inited)
    app.connect("doctree-read", _link_scripts_to_pages)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
