"""Check every internal link of the built HTML site, offline: `python docs/check_links.py docs/_build/html`.

Each ``href`` and ``src`` in every page that is not an external URL (``http:``, ``https:``, ``mailto:``,
``data:``) must name a file of the site, and its ``#fragment``, if any, an ``id`` (or ``name``) in
that file. External links are not fetched. Exit status 1, with one line per broken link, if any is
broken. (``make docs`` runs it after ``sphinx-build -W -n``, which already fails on unresolved
cross-references; this catches what reaches the HTML some other way: raw links, anchors, downloads.)
"""

from __future__ import annotations

import argparse
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

EXTERNAL = ("http", "https", "mailto", "data", "javascript", "ftp")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[tuple[int, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (name == "name" and tag == "a"):
                self.ids.add(value)
            elif name in ("href", "src") and not (tag == "link" and name == "href" and value.startswith("#")):
                self.links.append((self.getpos()[0], value))


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    return page


def check(site: Path) -> list[str]:
    site = site.resolve()
    pages = {path: _parse(path) for path in sorted(site.rglob("*.html"))}
    broken = []
    for path, page in pages.items():
        for line, link in page.links:
            parts = urlsplit(link)
            if parts.scheme in EXTERNAL or parts.netloc:
                continue
            if parts.scheme:
                broken.append(f"{path.relative_to(site)}:{line}: unsupported link {link!r}")
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file() or site not in (target, *target.parents):
                broken.append(f"{path.relative_to(site)}:{line}: {link!r}: no such file in the site")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else _parse(target).ids
                if fragment not in ids:
                    broken.append(f"{path.relative_to(site)}:{line}: {link!r}: no id {fragment!r} in {target.name}")
    return broken


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built HTML folder (docs/_build/html)")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        parser.error(f"{args.site} has no index.html: build the site first (make docs)")
    broken = check(args.site)
    for line in broken:
        print(line)
    pages = sum(1 for _ in args.site.rglob("*.html"))
    print(f"check_links: {pages} pages, {len(broken)} broken internal links", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
