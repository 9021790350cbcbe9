#!/usr/bin/env python3
"""Counts the test results of one `bazel test` invocation, per test case, without
over-counting.

Usage: count_results.py CONSOLE_LOG TESTLOGS_DIR
  CONSOLE_LOG   Bazel's console output of the invocation (its per-target status lines)
  TESTLOGS_DIR  `bazel info bazel-testlogs` of the same configuration
Prints one line "PASSED FAILED SKIPPED" (three integers) on stdout, and the reasons for
every failure on stderr. Exits 0 when it could count (whatever the results), non-zero
when it could not (unreadable input): the caller must then fail the run.

Rules:
- Only targets with a status line in CONSOLE_LOG are counted, and for each only the
  test.xml files of this invocation's layout: with N runs per test ("Stats over N runs"
  or "in K out of N"), run_1_of_N .. run_N_of_N (and their shards); with one run, the
  target's own test.xml or its shard_*_of_M files. Files of an earlier layout left in
  the testlogs directory are never read.
- A test case is identified by its suite and name and is counted ONCE per invocation,
  however many runs or shards contain it: failed if it failed (or errored) in any run,
  skipped if it was skipped in every run that had it, otherwise passed.
- A target whose status is not a pass (FAILED, FLAKY, TIMEOUT, INCOMPLETE, ...) but
  whose cases all passed failed outside its cases: a sanitizer (LSan) report at exit, a
  crash in teardown, a run without XML. Then EVERY case of that target counts as failed
  and none of its passes count (the target cannot be trusted case by case). The same
  holds for a failed target whose run logs carry a sanitizer report, even where some of
  its cases also failed.
- FLAKY (a run failed, a retry passed) counts as failed: a flake must not land.
- A target that failed to build, or has no readable XML, counts as one failed case
  (one passed case when Bazel says PASSED but no XML exists, e.g. an sh_test).
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS_RE = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|"
    r"INCOMPLETE|REMOTE FAILURE|SKIPPED|BUILT)\b(.*)$")
RUNS_IN_STATUS_RE = re.compile(r"\bin \d+ out of (\d+)\b")
STATS_RE = re.compile(r"^Stats over (\d+) runs:")
SANITIZER_RE = re.compile(r"^(?:==\d+==)?ERROR: (?:LeakSanitizer|AddressSanitizer|"
                          r"UndefinedBehaviorSanitizer|ThreadSanitizer)", re.M)


def parse_console(path):
    """Returns {label: (status, runs)} from Bazel's console output."""
    targets = {}
    last = None
    with open(path, errors="replace") as f:
        for raw in f:
            line = raw.strip()
            m = STATUS_RE.match(line)
            if m:
                label, status, rest = m.group(1), m.group(2), m.group(3)
                # "FLAKY, failed in 1 out of 2" counts attempts (the last one's results
                # are the target's own test.xml), not runs.
                r = RUNS_IN_STATUS_RE.search(rest) if status != "FLAKY" else None
                targets[label] = (status, int(r.group(1)) if r else 1)
                last = label
                continue
            s = STATS_RE.match(line)
            if s and last is not None:
                status, _ = targets[last]
                targets[last] = (status, int(s.group(1)))
            last = None if not s else last
    return targets


def run_dirs(tdir, runs):
    """Directories holding this invocation's results of one target."""
    if runs > 1:
        return [os.path.join(tdir, f"run_{k}_of_{runs}") for k in range(1, runs + 1)]
    return [tdir]


def xml_files(d):
    """test.xml of d itself and of its shard_*_of_* subdirectories (not run_* ones)."""
    out = []
    if os.path.isfile(os.path.join(d, "test.xml")):
        out.append(os.path.join(d, "test.xml"))
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            if re.match(r"shard_\d+_of_\d+$", name):
                x = os.path.join(d, name, "test.xml")
                if os.path.isfile(x):
                    out.append(x)
    return out


def log_files(d):
    out = []
    if os.path.isfile(os.path.join(d, "test.log")):
        out.append(os.path.join(d, "test.log"))
    if os.path.isdir(d):
        for name in sorted(os.listdir(d)):
            if re.match(r"shard_\d+_of_\d+$", name):
                x = os.path.join(d, name, "test.log")
                if os.path.isfile(x):
                    out.append(x)
    return out


def case_results(xml_paths):
    """{(suite, name): set of outcomes}; unreadable XML files are returned separately."""
    cases, broken = {}, []
    for x in xml_paths:
        try:
            tree = ET.parse(x)
        except (ET.ParseError, OSError):
            broken.append(x)
            continue
        for suite in tree.iter("testsuite"):
            sname = suite.get("name", "")
            for tc in suite.iter("testcase"):
                key = (tc.get("classname") or sname, tc.get("name", ""))
                if tc.find("failure") is not None or tc.find("error") is not None:
                    outcome = "failed"
                elif (tc.find("skipped") is not None or tc.get("status") == "notrun"
                      or tc.get("result") == "skipped"):
                    outcome = "skipped"
                else:
                    outcome = "passed"
                cases.setdefault(key, set()).add(outcome)
    return cases, broken


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def merge(outcomes):
    if "failed" in outcomes:
        return "failed"
    if outcomes == {"skipped"}:
        return "skipped"
    return "passed"


def count(console_log, testlogs):
    """Returns (passed, failed, skipped, details)."""
    targets = parse_console(console_log)
    passed = failed = skipped = 0
    details = []
    for label, (status, runs) in sorted(targets.items()):
        if status == "BUILT":
            continue
        pkg, _, name = label[2:].partition(":")
        tdir = os.path.join(testlogs, pkg, name)
        dirs = run_dirs(tdir, runs)
        xmls = [x for d in dirs for x in xml_files(d)]
        cases, broken = case_results(xmls)
        ok_status = status == "PASSED"
        if not cases:
            if ok_status and not broken:
                passed += 1
            else:
                failed += 1
                details.append(f"{label}: {status}" + (" (unreadable XML)" if broken else ""))
            continue
        merged = {k: merge(v) for k, v in cases.items()}
        p = sum(1 for v in merged.values() if v == "passed")
        fl = sum(1 for v in merged.values() if v == "failed")
        s = sum(1 for v in merged.values() if v == "skipped")
        # A failed target whose logs carry a sanitizer report failed outside its cases
        # too, even where some case also failed (in another run, say). A passing target's
        # logs are not searched: a death test may print a report on purpose.
        sanitizer = not ok_status and any(SANITIZER_RE.search(read(lg))
                                          for d in dirs for lg in log_files(d))
        outside = (not ok_status and fl == 0) or sanitizer or broken
        if outside:
            why = ("a sanitizer report in its log" if sanitizer else
                   "unreadable XML" if broken else f"status {status} with every case passed")
            details.append(f"{label}: failed outside its test cases ({why}); all {p + fl} "
                           f"run case(s) counted as failed")
            fl, p = fl + p, 0
        elif fl:
            details.append(f"{label}: {fl} case(s) failed" +
                           (f" (in at least one of {runs} runs)" if runs > 1 else ""))
            for (suite, case), v in sorted(merged.items()):
                if v == "failed":
                    details.append(f"    {suite}.{case}")
        passed, failed, skipped = passed + p, failed + fl, skipped + s
    return passed, failed, skipped, details


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    passed, failed, skipped, details = count(argv[1], argv[2])
    for d in details:
        print("  " + d, file=sys.stderr)
    print(passed, failed, skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
