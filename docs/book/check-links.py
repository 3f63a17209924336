#!/usr/bin/env python3
"""Fails on a broken relative link in the built book or in README.md.

Reads the HTML that `mdbook build docs/book` wrote to docs/book/book/: every relative
href and src must name an existing file (or folder), and every #anchor an id= in the page
it points to. The build output sits at the same depth as docs/book/src/, so a chapter's
link to a file beside the book (../../alerts.yml) resolves to the same file here as in
the repository. README.md's relative links must name existing files too, and a link into
a chapter (docs/book/src/X.md#a) an id in its built page. Standard library only.
"""
import html.parser
import os
import re
import sys
import urllib.parse

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BOOK = os.path.join(ROOT, "docs", "book", "book")
SRC = os.path.join(ROOT, "docs", "book", "src")
# Pages mdBook makes beside the chapters: print.html repeats every chapter (its links
# are rewritten for one page), 404.html is written for a site root.
SKIP = {"print.html", "404.html"}


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id" and value:
                self.ids.add(value)
            elif name in ("href", "src") and value:
                self.links.append(value)


pages = {}


def parse(path):
    if path not in pages:
        page = Page()
        with open(path, encoding="utf-8") as f:
            page.feed(f.read())
        pages[path] = page
    return pages[path]


def relative(link):
    """The path and anchor of a relative link, or None for one that leaves the tree."""
    parts = urllib.parse.urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith("/"):
        return None
    return urllib.parse.unquote(parts.path), urllib.parse.unquote(parts.fragment)


def check(source, base, link, to_page):
    """The problem with one link, or None. to_page maps a target file to the built page
    whose ids its anchors must match (None: not checked)."""
    rel = relative(link)
    if rel is None:
        return None
    path, anchor = rel
    target = os.path.normpath(os.path.join(base, path)) if path else source
    if not os.path.exists(target):
        return f"{link}: no file {os.path.relpath(target, ROOT)}"
    page = to_page(target)
    if anchor and page is not None and anchor not in parse(page).ids:
        return f"{link}: no anchor #{anchor} in {os.path.relpath(page, ROOT)}"
    return None


def built(target):
    return target if target.endswith(".html") and target.startswith(BOOK + os.sep) else None


def chapter(target):
    """The built page of a chapter's markdown source."""
    if target.startswith(SRC + os.sep) and target.endswith(".md"):
        return os.path.join(BOOK, os.path.relpath(target, SRC)[: -len(".md")] + ".html")
    return None


def main():
    if not os.path.isfile(os.path.join(BOOK, "index.html")):
        sys.exit(f"error: no book in {BOOK}: run `mdbook build docs/book` first")
    problems, count = [], 0
    for folder, _, files in os.walk(BOOK):
        for name in files:
            if not name.endswith(".html") or name in SKIP:
                continue
            path = os.path.join(folder, name)
            for link in parse(path).links:
                count += 1
                problem = check(path, folder, link, built)
                if problem:
                    problems.append(f"{os.path.relpath(path, ROOT)}: {problem}")

    # README.md, as GitHub renders it: links are relative to the repository's root.
    readme = os.path.join(ROOT, "README.md")
    with open(readme, encoding="utf-8") as f:
        text = f.read()
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        count += 1
        problem = check(readme, ROOT, link, chapter)
        if problem:
            problems.append(f"README.md: {problem}")

    for problem in problems:
        print(f"broken link: {problem}", file=sys.stderr)
    if problems:
        sys.exit(f"error: {len(problems)} broken link(s)")
    print(f"links: {count} checked, none broken")


if __name__ == "__main__":
    main()
