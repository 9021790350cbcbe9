#!/usr/bin/env python3
"""Unit tests of scripts/count_results.py on synthetic Bazel console logs and testlogs
trees (run by scripts/test.sh: python3 scripts/count_results_test.py)."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import count_results  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "count_results.py")


def case_xml(cases):
    """cases: list of (suite, name, outcome) with outcome passed/failed/skipped/notrun."""
    suites = {}
    for suite, name, outcome in cases:
        suites.setdefault(suite, []).append((name, outcome))
    out = ['<?xml version="1.0" encoding="UTF-8"?>', '<testsuites name="AllTests">']
    for suite, items in suites.items():
        out.append(f'  <testsuite name="{suite}" tests="{len(items)}">')
        for name, outcome in items:
            attrs = f'name="{name}" classname="{suite}"'
            if outcome == "failed":
                out.append(f'    <testcase {attrs} status="run" result="completed">'
                           '<failure message="x"/></testcase>')
            elif outcome == "skipped":
                out.append(f'    <testcase {attrs} status="run" result="skipped">'
                           '<skipped message="no device"/></testcase>')
            elif outcome == "notrun":
                out.append(f'    <testcase {attrs} status="notrun" result="suppressed"/>')
            else:
                out.append(f'    <testcase {attrs} status="run" result="completed"/>')
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


class CountTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.logs = os.path.join(self.tmp.name, "testlogs")
        self.console = os.path.join(self.tmp.name, "console.log")
        self.lines = []

    def tearDown(self):
        self.tmp.cleanup()

    def target(self, label, status_line, runs=1, xml=None, log="", sub=""):
        """Adds a status line and writes xml (a string, or a list of cases) under the
        target's directory (or its subdirectory `sub`, e.g. run_2_of_3)."""
        self.lines.append(f"{label:<70s}{status_line}")
        if runs > 1:
            self.lines.append(f"  Stats over {runs} runs: max = 0.1s, min = 0.1s")
        if xml is not None or log:
            pkg, _, name = label[2:].partition(":")
            d = os.path.join(self.logs, pkg, name, sub)
            os.makedirs(d, exist_ok=True)
            if xml is not None:
                with open(os.path.join(d, "test.xml"), "w") as f:
                    f.write(xml if isinstance(xml, str) else case_xml(xml))
            if log:
                with open(os.path.join(d, "test.log"), "w") as f:
                    f.write(log)

    def put(self, label, sub, xml=None, log=""):
        pkg, _, name = label[2:].partition(":")
        d = os.path.join(self.logs, pkg, name, sub)
        os.makedirs(d, exist_ok=True)
        if xml is not None:
            with open(os.path.join(d, "test.xml"), "w") as f:
                f.write(xml if isinstance(xml, str) else case_xml(xml))
        if log:
            with open(os.path.join(d, "test.log"), "w") as f:
                f.write(log)

    def count(self):
        with open(self.console, "w") as f:
            f.write("INFO: Build completed\n" + "\n".join(self.lines) + "\n\nExecuted 1 tests\n")
        p, fl, s, _ = count_results.count(self.console, self.logs)
        return p, fl, s

    def test_cases_of_a_passing_target_count_one_each(self):
        self.target("//a:t", "PASSED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "two", "passed"), ("S", "off", "skipped"),
                         ("S", "disabled", "notrun")])
        self.assertEqual(self.count(), (2, 0, 2))

    def test_failure_after_the_cases_fails_every_case_of_the_target(self):
        # An LSan report at exit: every case passed in the XML, the binary failed.
        self.target("//a:leaky", "FAILED in 0.3s",
                    xml=[("S", "one", "passed"), ("S", "two", "passed"), ("S", "three", "passed")],
                    log="[  PASSED  ] 3 tests.\n==12==ERROR: LeakSanitizer: detected memory leaks\n")
        self.target("//a:ok", "PASSED in 0.1s", xml=[("S", "x", "passed")])
        self.assertEqual(self.count(), (1, 3, 0))

    def test_a_failed_case_counts_failed_and_the_others_passed(self):
        self.target("//a:t", "FAILED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "two", "failed"), ("S", "three", "passed")])
        self.assertEqual(self.count(), (2, 1, 0))

    def test_a_sanitizer_report_in_a_failed_target_fails_all_its_cases(self):
        self.target("//a:t", "FAILED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "two", "failed")],
                    log="==7==ERROR: AddressSanitizer: heap-use-after-free\n")
        self.assertEqual(self.count(), (0, 2, 0))

    def test_runs_per_test_counts_each_case_once_and_a_failure_in_any_run_fails_it(self):
        label = "//tests/engine:e2e_test"
        self.target(label, "FAILED in 1 out of 3 in 2.0s", runs=3)
        good = [("E2e", "a", "passed"), ("E2e", "b", "passed"), ("E2e", "c", "skipped")]
        self.put(label, "run_1_of_3", good)
        self.put(label, "run_2_of_3", [("E2e", "a", "passed"), ("E2e", "b", "failed"),
                                       ("E2e", "c", "skipped")])
        self.put(label, "run_3_of_3", good)
        # Stale results of an earlier single run (more cases) must not be read.
        self.put(label, "", [("Old", "x", "passed"), ("Old", "y", "failed")])
        self.assertEqual(self.count(), (1, 1, 1))

    def test_runs_per_test_all_passing_counts_once(self):
        label = "//tests/verbs:sim_test"
        self.target(label, "PASSED in 0.5s", runs=3)
        for k in (1, 2, 3):
            self.put(label, f"run_{k}_of_3", [("V", "a", "passed"), ("V", "b", "passed")])
        self.assertEqual(self.count(), (2, 0, 0))

    def test_a_crashed_run_without_cases_fails_the_whole_target(self):
        label = "//tests/engine:t"
        self.target(label, "FAILED in 1 out of 3 in 2.0s", runs=3)
        self.put(label, "run_1_of_3", [("E", "a", "passed"), ("E", "b", "passed")])
        self.put(label, "run_2_of_3", xml="<testsuites><testsuite", log="Segmentation fault\n")
        self.put(label, "run_3_of_3", [("E", "a", "passed"), ("E", "b", "passed")])
        self.assertEqual(self.count(), (0, 2, 0))

    def test_flaky_counts_failed(self):
        self.target("//a:t", "FLAKY, failed in 1 out of 2 in 0.2s",
                    xml=[("S", "one", "passed"), ("S", "two", "passed")])
        self.assertEqual(self.count(), (0, 2, 0))

    def test_targets_without_results(self):
        self.target("//a:broken", "FAILED TO BUILD")
        self.target("//a:none", "NO STATUS")
        self.target("//a:slow", "TIMEOUT in 300.0s")
        self.target("//a:sh", "PASSED in 1.0s")  # an sh_test without XML
        self.assertEqual(self.count(), (1, 3, 0))

    def test_shards_are_merged(self):
        label = "//a:sharded"
        self.target(label, "PASSED in 0.2s")
        self.put(label, "shard_1_of_2", [("S", "a", "passed")])
        self.put(label, "shard_2_of_2", [("S", "b", "passed"), ("S", "c", "skipped")])
        self.assertEqual(self.count(), (2, 0, 1))

    def test_unreadable_xml_of_a_passed_target_counts_failed(self):
        self.target("//a:t", "PASSED in 0.1s", xml="<testsuites><oops")
        self.assertEqual(self.count(), (0, 1, 0))

    def test_cached_status_and_built_lines(self):
        self.target("//a:t", "(cached) PASSED in 0.1s", xml=[("S", "one", "passed")])
        self.lines.append("//a:lib" + " " * 60 + "BUILT")  # not a test
        self.assertEqual(self.count(), (1, 0, 0))

    def test_the_script_prints_three_integers_and_crashes_loudly(self):
        self.target("//a:t", "PASSED in 0.1s", xml=[("S", "one", "passed")])
        with open(self.console, "w") as f:
            f.write("\n".join(self.lines) + "\n")
        r = subprocess.run([sys.executable, SCRIPT, self.console, self.logs],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0)
        self.assertEqual(r.stdout.split(), ["1", "0", "0"])
        # A missing console log is a crash of the counter: non-zero, nothing on stdout.
        r = subprocess.run([sys.executable, SCRIPT, self.console + ".missing", self.logs],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stdout.strip(), "")


if __name__ == "__main__":
    unittest.main()
