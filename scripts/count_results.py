#!/usr/bin/env python3
"""Counts test results of one `bazel test` run, per test case where the logs allow.

Reads Bazel's console output (argv[1]) for the per-target status lines and, for each
target that ran, its test.xml under the testlogs directory (argv[2]). A target whose
XML lists test cases contributes those cases; a target that failed to build, timed out
or crashed without XML counts as one failed case. Prints "passed failed skipped".
"""
import os
import re
import sys
import xml.etree.ElementTree as ET

out_path, testlogs = sys.argv[1], sys.argv[2]
status_re = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|FAILED TO BUILD|INCOMPLETE|REMOTE FAILURE|SKIPPED)\b")
targets = {}
with open(out_path, errors="replace") as f:
    for line in f:
        m = status_re.match(line.strip())
        if m:
            targets[m.group(1)] = m.group(2)

passed = failed = skipped = 0
details = []
for label, status in sorted(targets.items()):
    pkg, name = label[2:].split(":", 1)
    tdir = os.path.join(testlogs, pkg, name)
    xmls = []
    for root, _, files in os.walk(tdir):
        if "test.xml" in files:
            xmls.append(os.path.join(root, "test.xml"))
    cases = []
    for x in xmls:
        try:
            tree = ET.parse(x)
        except ET.ParseError:
            continue
        for tc in tree.iter("testcase"):
            bad = tc.find("failure") is not None or tc.find("error") is not None
            skip = tc.find("skipped") is not None or tc.get("status") == "notrun" \
                or tc.get("result") == "skipped"
            cases.append("failed" if bad else "skipped" if skip else "passed")
    if status not in ("PASSED", "FAILED", "FLAKY") or not cases:
        ok = status in ("PASSED", "FLAKY")
        passed += ok
        failed += not ok
        if not ok:
            details.append(f"{label}: {status}")
        continue
    p, fl, s = cases.count("passed"), cases.count("failed"), cases.count("skipped")
    if status == "FAILED" and fl == 0:
        fl = 1  # the binary failed after its cases passed (a sanitizer report, a crash)
        details.append(f"{label}: failed outside its test cases (see test.log)")
    elif fl:
        details.append(f"{label}: {fl} case(s) failed")
    passed, failed, skipped = passed + p, failed + fl, skipped + s

for d in details:
    print("  " + d, file=sys.stderr)
print(passed, failed, skipped)
