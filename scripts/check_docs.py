#!/usr/bin/env python3
"""Checks that the documentation reads in order and its links hold.

Fails (exit 1, one line per problem) when:
- README.md has MAX_README_LINES lines or more (the README stays a front page; the rest
  belongs in docs/);
- a relative link in README.md or docs/*.md points to a file that does not exist, or to
  a #heading that no heading of a markdown target (or of the same file) produces under
  GitHub's anchor rules (lower case, punctuation dropped, spaces to '-', a repeated
  heading gets -1, -2, ...);
- a docs/*.md file is not linked from README.md.
Links inside fenced code blocks and inline code are not links. External links (a scheme
such as https:, or mailto:) are not checked.

`--self-test` plants each fault in a temporary copy of the documentation and checks that
each is caught, and that the clean copy passes. `--root DIR` checks another tree.
"""
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_README_LINES = 350

LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text):
    """(line number, line) of the lines outside fenced code blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * 3
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence):
                fence = None
            continue
        yield n, line


def strip_inline_code(line):
    return re.sub(r"(`+)(.+?)\1", "", line)


def slug(heading):
    """GitHub's anchor of a heading's text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)  # punctuation dropped (\w keeps letters, digits, _)
    return text.replace(" ", "-")


def anchors(text):
    """Every anchor the headings of a markdown text produce, with GitHub's -N suffixes."""
    seen, out = {}, set()
    for _, line in prose_lines(text):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else "%s-%d" % (base, n))
    return out


def paragraphs(text):
    """(first line number, [line numbers], joined text) of each prose paragraph, so that a
    link whose text runs over a line break is still found."""
    para, numbers = [], []
    for n, line in list(prose_lines(text)) + [(0, "")]:
        if line.strip() and not HEADING.match(line):
            para.append(line)
            numbers.append(n)
            continue
        if para:
            yield numbers, para
        para, numbers = [], []
        if line.strip():
            yield [n], [line]


def links(text):
    """(line number, target) of every link and image in the prose of a markdown text."""
    for numbers, lines in paragraphs(text):
        joined, starts = "", []
        for line in lines:
            starts.append(len(joined))
            joined += strip_inline_code(line) + " "
        for pattern in (LINK, IMAGE):
            for m in pattern.finditer(joined):
                i = max(k for k, s in enumerate(starts) if s <= m.start())
                yield numbers[i], m.group(1)


def doc_files(root):
    return [root / "README.md"] + sorted((root / "docs").glob("*.md"))


def problems(root):
    found = []
    readme = root / "README.md"
    if not readme.exists():
        return ["README.md: missing"]
    nlines = len(readme.read_text().split("\n")) - (1 if readme.read_text().endswith("\n") else 0)
    if nlines >= MAX_README_LINES:
        found.append("README.md: %d lines; it must stay under %d (move the detail to docs/)"
                     % (nlines, MAX_README_LINES))
    anchor_cache = {}

    def anchors_of(path):
        if path not in anchor_cache:
            anchor_cache[path] = anchors(path.read_text())
        return anchor_cache[path]

    linked_from_readme = set()
    for doc in doc_files(root):
        text = doc.read_text()
        rel = doc.relative_to(root)
        for n, target in links(text):
            if SCHEME.match(target) or target.startswith("//"):
                continue
            path_part, _, anchor = target.partition("#")
            dest = (doc.parent / path_part).resolve() if path_part else doc.resolve()
            where = "%s:%d: link %s" % (rel, n, target)
            if not dest.exists():
                found.append("%s: no such file" % where)
                continue
            if doc == readme and path_part:
                linked_from_readme.add(dest)
            if anchor and dest.suffix == ".md":
                if anchor not in anchors_of(dest):
                    shown = (dest.relative_to(root.resolve())
                             if dest.is_relative_to(root.resolve()) else dest)
                    found.append("%s: no heading of %s has the anchor #%s" % (where, shown, anchor))
    for doc in sorted((root / "docs").glob("*.md")):
        if doc.resolve() not in linked_from_readme:
            found.append("docs/%s: not linked from README.md" % doc.name)
    return found


def self_test():
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "clean"
        base.mkdir()
        shutil.copy(ROOT / "README.md", base / "README.md")
        shutil.copytree(ROOT / "docs", base / "docs")
        # Files outside README.md and docs/ that the documents link to come along, so that
        # the clean copy passes exactly when the real tree does.
        for doc in doc_files(ROOT):
            for _, target in links(doc.read_text()):
                path_part = target.partition("#")[0]
                if not path_part or SCHEME.match(target):
                    continue
                src = (doc.parent / path_part).resolve()
                if src.is_file() and src.is_relative_to(ROOT):
                    dst = base / src.relative_to(ROOT)
                    if not dst.exists():
                        dst.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy(src, dst)
        clean = problems(base)
        assert clean == [], "the clean copy must pass: %s" % clean

        def planted(name, plant, expect):
            tree = Path(tmp) / name
            shutil.copytree(base, tree)
            plant(tree)
            found = problems(tree)
            assert any(expect in p for p in found), "%s not caught: %s" % (name, found)
            print("check_docs self-test: %s caught: %s" % (name, [p for p in found if expect in p][0]))

        def append(path, text):
            path.write_text(path.read_text() + text)

        planted("long README",
                lambda t: append(t / "README.md", "line\n" * MAX_README_LINES),
                "lines; it must stay under")
        planted("missing file",
                lambda t: append(t / "docs" / "api.md", "\nSee [this](no_such_file.md).\n"),
                "no_such_file.md: no such file")
        planted("missing heading in another file",
                lambda t: append(t / "README.md", "\nSee [gpu](docs/gpu.md#no-such-heading).\n"),
                "has the anchor #no-such-heading")
        planted("missing heading in the same file",
                lambda t: append(t / "docs" / "design.md", "\nSee [above](#nowhere-at-all).\n"),
                "has the anchor #nowhere-at-all")
        planted("missing file from README",
                lambda t: append(t / "README.md", "\nSee [it](docs/gone.md).\n"),
                "docs/gone.md: no such file")
        planted("missing heading, link over a line break",
                lambda t: append(t / "docs" / "design.md",
                                 "\nSee [the part\nabove](#nowhere-either) here.\n"),
                "has the anchor #nowhere-either")
        planted("docs file not linked from README",
                lambda t: (t / "docs" / "orphan.md").write_text("# Orphan\n\nWhat this is: nothing.\n"),
                "docs/orphan.md: not linked from README.md")
        # Not faults: a link inside a code block or inline code, an external link, and an
        # anchor of a repeated heading (-1).
        tree = Path(tmp) / "not faults"
        shutil.copytree(base, tree)
        append(tree / "docs" / "design.md",
               "\n```\n[x](missing.md)\n```\n\n`[y](missing.md)` [z](https://example.com/a#b)\n"
               "\n## Twice\n\n## Twice\n\n[second](#twice-1)\n")
        assert problems(tree) == [], problems(tree)
    print("check_docs self-test: every planted fault caught, the clean copy passes")


def main(argv):
    if "--self-test" in argv:
        self_test()
        return 0
    root = ROOT
    if "--root" in argv:
        root = Path(argv[argv.index("--root") + 1]).resolve()
    found = problems(root)
    for p in found:
        print("check_docs: " + p)
    readme_lines = len((root / "README.md").read_text().splitlines())
    print("check_docs: README.md %d lines, %d docs files, %d problems"
          % (readme_lines, len(list((root / "docs").glob("*.md"))), len(found)))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
