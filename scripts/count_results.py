#!/usr/bin/env python3
"""Counts the test results of one `bazel test` invocation, per test case, without
over-counting.

Usage: count_results.py CONSOLE_LOG TESTLOGS_DIR [--expected-skips FILE --config NAME
                        [--partial]]
  CONSOLE_LOG   Bazel's console output of the invocation (its per-target status lines)
  TESTLOGS_DIR  `bazel info bazel-testlogs` of the same configuration
  --expected-skips FILE  the list of test cases expected to skip (tests/expected_skips.txt),
                checked against this invocation's cases (see "Expected skips" below)
  --config NAME the configuration of the invocation (default, asan, tsan): entries
                restricted to other configurations do not apply
  --partial     the invocation ran only some targets (the tsan phase): an entry that
                matches no case of it is not stale
Prints one line "PASSED FAILED SKIPPED" (three integers) on stdout, and the reasons for
every failure on stderr. Exits 0 when it could count (whatever the results), non-zero
when it could not (unreadable input): the caller must then fail the run.

Rules:
- Only targets with a status line in CONSOLE_LOG are counted, and for each only the
  test.xml files of this invocation's layout. Bazel's "Stats over N runs" (or "in K out
  of N") counts test actions, shards times runs: one action writes the target's own
  test.xml; N write run_R_of_N, shard_S_of_N or shard_S_of_M_run_R_of_K (M*K = N).
  Files of an earlier layout left in the testlogs directory are not read (of complete
  layouts with N actions, the one written last is this invocation's); an announced
  action without results fails the target outside its cases.
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
- A ThreadSanitizer report anywhere in a target's logs fails the target outside its
  cases, even when Bazel says PASSED: a child process (ote_target) that reports a race
  and halts may leave its parent's cases passing.

Expected skips (--expected-skips): every line of the file is
  [CONFIGS] PATTERN REASON
where PATTERN is an fnmatch pattern over "Suite.Case" as GoogleTest's XML names it
("Prefix/Suite.Case/Param" for parameterized cases), REASON is mandatory free text, and
the optional [CONFIGS] (e.g. "[tsan]" or "[asan,tsan]") restricts the entry to those
configurations; '#' starts a comment line. In an invocation of configuration NAME:
- a case that skipped (in any run) and matches no entry for NAME is an unexpected skip:
  it counts as failed instead of skipped (or passed);
- a case that matches an entry for NAME and passed (in any run) no longer skips: it
  counts as failed, so the list stays true (remove or narrow the entry);
- without --partial, an entry for NAME that matches no case at all is stale: one more
  failed case.
Cases of a target that failed outside its cases are already all failed: not adjusted.
A malformed file is a crash of the counter (exit non-zero).
"""
import argparse
import fnmatch
import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS_RE = re.compile(
    r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|"
    r"INCOMPLETE|REMOTE FAILURE|SKIPPED|BUILT)\b(.*)$")
RUNS_IN_STATUS_RE = re.compile(r"\bin \d+ out of (\d+)\b")
STATS_RE = re.compile(r"^Stats over (\d+) runs:")
SANITIZER_RE = re.compile(r"^(?:==\d+==)?(?:ERROR|WARNING|FATAL): (?:LeakSanitizer|"
                          r"AddressSanitizer|UndefinedBehaviorSanitizer|ThreadSanitizer)",
                          re.M)
# A ThreadSanitizer report (a race, a lock-order inversion, a fatal error) or its exit
# summary; searched in every counted target's logs, passing ones included.
TSAN_RE = re.compile(r"^(?:==\d+==)?(?:(?:WARNING|FATAL|ERROR): ThreadSanitizer[: ]|"
                     r"ThreadSanitizer: )", re.M)
SKIP_LINE_RE = re.compile(r"^(?:\[([A-Za-z0-9_-]+(?:,[A-Za-z0-9_-]+)*)\]\s+)?(\S+)\s+(\S.*)$")


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


LAYOUT_RE = re.compile(r"^(?:shard_(\d+)_of_(\d+))?_?(?:run_(\d+)_of_(\d+))?$")


def run_dirs(tdir, actions):
    """The directories holding this invocation's results of one target, and whether the
    layout is complete. Bazel's "Stats over N runs" counts test actions: shards times
    runs. One action writes the target's own directory; N write run_R_of_N,
    shard_S_of_N, or shard_S_of_M_run_R_of_K with M*K = N. Of the layouts present with
    N actions in all (an earlier invocation may have left another), the complete one
    written last is this invocation's; none complete: the missing actions are a failure."""
    if actions <= 1:
        return [tdir], True
    layouts = {}
    names = sorted(os.listdir(tdir)) if os.path.isdir(tdir) else []
    for name in names:
        m = LAYOUT_RE.match(name)
        if not m or not (m.group(1) or m.group(3)):
            continue
        shards, runs = int(m.group(2) or 1), int(m.group(4) or 1)
        if shards * runs == actions:
            layouts.setdefault((shards, runs), []).append(os.path.join(tdir, name))
    complete = [d for d in layouts.values() if len(d) == actions]
    if not complete:
        return [d for ds in layouts.values() for d in ds], False

    def written(ds):
        return max(os.path.getmtime(d) for d in ds)
    return max(complete, key=written), True


def xml_files(d):
    """The test.xml of one action's directory, if it wrote one."""
    x = os.path.join(d, "test.xml")
    return [x] if os.path.isfile(x) else []


def log_files(d):
    """The test.log of one action's directory, if it wrote one."""
    x = os.path.join(d, "test.log")
    return [x] if os.path.isfile(x) else []


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


class SkipEntry:
    """One line of the expected-skips file."""

    def __init__(self, configs, pattern, reason, where):
        self.configs, self.pattern, self.reason, self.where = configs, pattern, reason, where

    def applies(self, config):
        return self.configs is None or config in self.configs

    def matches(self, case_id):
        return fnmatch.fnmatchcase(case_id, self.pattern)


def load_expected_skips(path):
    """Entries of an expected-skips file; raises ValueError on a malformed line."""
    entries = []
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = SKIP_LINE_RE.match(line)
            if not m or m.group(2).startswith("["):
                raise ValueError(f"{path}:{n}: expected '[CONFIGS] PATTERN REASON': {line!r}")
            configs = set(m.group(1).split(",")) if m.group(1) else None
            entries.append(SkipEntry(configs, m.group(2), m.group(3), f"{path}:{n}"))
    return entries


def check_skips(cases, entries, config, partial):
    """cases: [(label, case_id, outcomes, merged)] of trusted targets, plus untrusted
    ones with merged None (they only mark entries as matching something). Returns
    (dpassed, dfailed, dskipped, details): the adjustments to the counts."""
    applicable = [e for e in entries if e.applies(config)]
    used = set()
    dp = df = ds = 0
    details = []
    for label, case_id, outcomes, merged in cases:
        hits = [e for e in applicable if e.matches(case_id)]
        used.update(id(e) for e in hits)
        if merged is None or merged == "failed":
            continue
        if "skipped" in outcomes and not hits:
            details.append(f"{label}: {case_id} skipped but is not in the expected skips "
                           f"for {config}: counted as failed")
        elif hits and "passed" in outcomes:
            details.append(f"{label}: {case_id} is listed as skipping ({hits[0].where}) but "
                           f"ran and passed in {config}: counted as failed (update the list)")
        else:
            continue
        df += 1
        if merged == "skipped":
            ds -= 1
        else:
            dp -= 1
    for e in applicable:
        if id(e) not in used and not partial:
            df += 1
            details.append(f"{e.where}: '{e.pattern}' matches no test case of this {config} "
                           f"run: a stale entry, counted as one failure")
    return dp, df, ds, details


def count_target(label, status, runs, testlogs, details, seen):
    """Counts one target: returns (passed, failed, skipped) and appends to details; adds
    (label, case_id, outcomes, merged or None when untrusted) for each case to seen."""
    pkg, _, name = label[2:].partition(":")
    dirs, complete = run_dirs(os.path.join(testlogs, pkg, name), runs)
    cases, broken = case_results([x for d in dirs for x in xml_files(d)])
    if not complete:
        details.append(f"{label}: the results of some of its {runs} test actions (shards x "
                       f"runs) are missing")
        broken = True
    ok_status = status == "PASSED"
    logs = [read(lg) for d in dirs for lg in log_files(d)]
    tsan = any(TSAN_RE.search(text) for text in logs)
    if not cases:
        if ok_status and not broken and not tsan:
            return 1, 0, 0
        details.append(f"{label}: {status}" + (" (unreadable XML)" if broken else "") +
                       (" (a ThreadSanitizer report in its log)" if tsan else ""))
        return 0, 1, 0
    merged = {k: merge(v) for k, v in cases.items()}
    p = sum(1 for v in merged.values() if v == "passed")
    fl = sum(1 for v in merged.values() if v == "failed")
    s = sum(1 for v in merged.values() if v == "skipped")
    # A failed target whose logs carry a sanitizer report failed outside its cases too,
    # even where some case also failed (in another run, say). A passing target's logs are
    # searched for ThreadSanitizer reports only: a death test may print an ASan report on
    # purpose, while no test provokes a race.
    sanitizer = tsan or (not ok_status and any(SANITIZER_RE.search(t) for t in logs))
    outside = (not ok_status and fl == 0) or sanitizer or broken
    for (suite, case), v in sorted(merged.items()):
        seen.append((label, f"{suite}.{case}", cases[(suite, case)], None if outside else v))
    if outside:
        why = ("a sanitizer report in its log" if sanitizer else
               "unreadable XML" if broken else f"status {status} with every case passed")
        details.append(f"{label}: failed outside its test cases ({why}); all {p + fl} "
                       f"run case(s) counted as failed")
        return 0, fl + p, s
    if fl:
        details.append(f"{label}: {fl} case(s) failed" +
                       (f" (in at least one of {runs} runs)" if runs > 1 else ""))
        for (suite, case), v in sorted(merged.items()):
            if v == "failed":
                details.append(f"    {suite}.{case}")
    return p, fl, s


def count(console_log, testlogs, skips=None, config="default", partial=False):
    """Returns (passed, failed, skipped, details). skips: expected-skip entries to check
    (None: no check)."""
    targets = parse_console(console_log)
    passed = failed = skipped = 0
    details, seen = [], []
    for label, (status, runs) in sorted(targets.items()):
        if status == "BUILT":
            continue
        p, fl, s = count_target(label, status, runs, testlogs, details, seen)
        passed, failed, skipped = passed + p, failed + fl, skipped + s
    if skips is not None:
        dp, df, ds, more = check_skips(seen, skips, config, partial)
        passed, failed, skipped = passed + dp, failed + df, skipped + ds
        details += more
    return passed, failed, skipped, details


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], usage=__doc__)
    ap.add_argument("console_log")
    ap.add_argument("testlogs")
    ap.add_argument("--expected-skips")
    ap.add_argument("--config", default="default")
    ap.add_argument("--partial", action="store_true")
    args = ap.parse_args(argv[1:])
    skips = load_expected_skips(args.expected_skips) if args.expected_skips else None
    passed, failed, skipped, details = count(args.console_log, args.testlogs, skips,
                                             args.config, args.partial)
    for d in details:
        print("  " + d, file=sys.stderr)
    print(passed, failed, skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
