#!/usr/bin/env python3
"""Fails when a fault point in library code is never armed by a test.

A fault point is a call `ote_fault_hit("name", ...)` in a library source (.c/.h) under
one of the library packages (base, verbs, cuda, context, cq, qp, endpoint, grant, engine,
tools). Its name must be a string literal: a call whose first argument is not one cannot
be checked and fails too. A point counts as armed when its quoted name ("name") appears in
some file under tests/ (tests arm points with ote_fault_arm("name", ...), or through a
constant such as `constexpr char kPoint[] = "name";`); a name seen only in tests/ that
no library code hits is reported as stale (a warning, not a failure).

Usage:
  scripts/check_fault_points.py [ROOT]      check the tree at ROOT (default: repo root);
                                            prints every point with where it is armed
  scripts/check_fault_points.py --self-test plants an unarmed point and a non-literal
                                            call in a scratch copy and checks both fail
Exit status 0 when every point is armed, 1 otherwise (2 on a usage error).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

LIBRARY_DIRS = ["base", "verbs", "cuda", "context", "cq", "qp", "endpoint", "grant", "engine",
                "tools"]
HIT_RE = re.compile(r"\bote_fault_hit\s*\(\s*(\"(?:[^\"\\]|\\.)*\"|[^,)]*)")
# The declarations and definition of ote_fault_hit itself are not fault points.
DEFINITION_RE = re.compile(r"\b(?:bool|inline)\s+ote_fault_hit\s*\(")


def strip_comments(text):
    """Removes /* */ and // comments, keeping line numbers and string literals intact."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def source_files(root, dirs, exts):
    for d in dirs:
        base = os.path.join(root, d)
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [x for x in dirnames if not x.startswith("bazel-")]
            for f in sorted(files):
                if f.endswith(exts):
                    yield os.path.join(dirpath, f)


def fault_points(root):
    """Returns ({name: [file:line, ...]}, [problems])."""
    points, problems = {}, []
    for path in source_files(root, LIBRARY_DIRS, (".c", ".h", ".cc")):
        with open(path, errors="replace") as f:
            text = strip_comments(f.read())
        rel = os.path.relpath(path, root)
        for m in HIT_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            start = text.rfind("\n", 0, m.start()) + 1
            if DEFINITION_RE.search(text[start:m.end()]):
                continue
            arg = m.group(1).strip()
            if not arg.startswith('"'):
                problems.append(f"{rel}:{line}: ote_fault_hit() with a name that is not a "
                                f"string literal ({arg or '?'}): it cannot be checked")
                continue
            points.setdefault(arg[1:-1], []).append(f"{rel}:{line}")
    return points, problems


def armed_in_tests(root, names):
    found = {n: [] for n in names}
    literals = {}
    for path in source_files(root, ["tests"], (".c", ".cc", ".h", ".sh", ".py")):
        with open(path, errors="replace") as f:
            text = f.read()
        rel = os.path.relpath(path, root)
        for n in names:
            if f'"{n}"' in text:
                found[n].append(rel)
        for m in re.finditer(r"ote_fault_arm\s*\(\s*\"([^\"]+)\"", text):
            literals.setdefault(m.group(1), set()).add(rel)
    return found, literals


def check(root, verbose=True):
    points, problems = fault_points(root)
    found, literals = armed_in_tests(root, sorted(points))
    unarmed = [n for n in sorted(points) if not found[n]]
    if verbose:
        for n in sorted(points):
            where = ", ".join(points[n])
            armed = ", ".join(found[n]) if found[n] else "NEVER ARMED"
            print(f"  {n:28s} hit at {where}; armed in {armed}")
    for p in problems:
        print("FAIL: " + p)
    for n in unarmed:
        print(f"FAIL: fault point \"{n}\" ({', '.join(points[n])}) is never armed under tests/")
    # Names tests arm that no library code hits (test-local names in tests/base are the
    # fault mechanism's own unit tests and are expected).
    for n, files in sorted(literals.items()):
        if n not in points and any(not f.startswith("tests/base/") for f in files):
            print(f"warning: tests arm \"{n}\" ({', '.join(sorted(files))}) but no library "
                  f"code hits it")
    ok = not unarmed and not problems
    print(f"fault points: {len(points)} in library code, {len(unarmed)} never armed, "
          f"{len(problems)} unreadable")
    return ok


def self_test(root):
    """Plants an unarmed point and a non-literal call in a scratch copy: both must fail,
    and the unmodified copy must give the same verdict as the real tree."""
    scratch = tempfile.mkdtemp()
    try:
        files = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True,
                               check=True).stdout.decode().split("\0")
        for rel in files:
            if not rel or not os.path.isfile(os.path.join(root, rel)):
                continue
            dst = os.path.join(scratch, rel)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.join(root, rel), dst)
        baseline = check(scratch, verbose=False)
        planted = os.path.join(scratch, "base", "planted_fault_point.c")
        with open(planted, "w") as f:
            f.write('#include "base/fault.h"\n'
                    'int planted(void) { ote_status_t st;\n'
                    '    if (ote_fault_hit("planted.never_armed", &st)) return 1;\n'
                    '    /* ote_fault_hit("planted.in_a_comment", &st) is no point */\n'
                    '    return 0; }\n')
        print("-- self-test: a planted unarmed point must fail")
        caught_unarmed = not check(scratch, verbose=False)
        os.remove(planted)
        with open(planted, "w") as f:
            f.write('#include "base/fault.h"\n'
                    'int planted(const char *n) { ote_status_t st;\n'
                    '    return ote_fault_hit(n, &st); }\n')
        print("-- self-test: a non-literal name must fail")
        caught_nonliteral = not check(scratch, verbose=False)
        os.remove(planted)
        ok = caught_unarmed and caught_nonliteral
        print(f"self-test: unarmed point {'caught' if caught_unarmed else 'MISSED'}, "
              f"non-literal name {'caught' if caught_nonliteral else 'MISSED'} "
              f"(unplanted tree {'passes' if baseline else 'fails'})")
        return ok
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if len(argv) > 1 and argv[1] == "--self-test":
        return 0 if self_test(root) else 1
    if len(argv) > 1:
        if argv[1].startswith("-"):
            print(__doc__, file=sys.stderr)
            return 2
        root = argv[1]
    return 0 if check(root) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
