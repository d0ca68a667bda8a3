"""Offline check of a built site's internal links: every relative ``href``/``src`` in its
HTML must name a file that exists (external links are not fetched).

    python -m tools.linkcheck build/site
"""

from __future__ import annotations

import html.parser
import pathlib
import sys
import urllib.parse


class _Refs(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("href", "src") and value:
                self.refs.append(value)


def broken_links(site: pathlib.Path) -> list[str]:
    """``page: link`` for each relative link of ``site``'s HTML pages whose file is missing."""
    problems = []
    for page in sorted(site.rglob("*.html")):
        if page.relative_to(site).parts[0] == "_static":  # theme template fragments
            continue
        parser = _Refs()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        for ref in parser.refs:
            parts = urllib.parse.urlsplit(ref)
            if parts.scheme or parts.netloc or ref.startswith(("#", "data:", "javascript:")):
                continue
            if not parts.path:
                continue
            target = (page.parent / urllib.parse.unquote(parts.path)).resolve()
            if parts.path.endswith("/"):
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{page.relative_to(site)}: {ref}")
    return problems


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    site = pathlib.Path(args[0] if args else "build/site")
    if not (site / "index.html").exists() and not any(site.rglob("*.html")):
        print(f"{site} holds no HTML: run `make site` first")
        return 1
    problems = broken_links(site)
    for p in problems:
        print(f"broken link: {p}")
    pages = sum(1 for _ in site.rglob("*.html"))
    print(f"{pages} pages, {len(problems)} broken relative link(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
