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

    def count(self, skips=None, config="default", partial=False):
        """skips: the text of an expected-skips file (None: no check)."""
        with open(self.console, "w") as f:
            f.write("INFO: Build completed\n" + "\n".join(self.lines) + "\n\nExecuted 1 tests\n")
        entries = None
        if skips is not None:
            path = os.path.join(self.tmp.name, "expected_skips.txt")
            with open(path, "w") as f:
                f.write(skips)
            entries = count_results.load_expected_skips(path)
        p, fl, s, self.details = count_results.count(self.console, self.logs, entries, config,
                                                     partial)
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
        # Bazel's console counts each shard as a run: "Stats over 2 runs".
        label = "//a:sharded"
        self.target(label, "PASSED in 0.2s", runs=2)
        self.put(label, "shard_1_of_2", [("S", "a", "passed")])
        self.put(label, "shard_2_of_2", [("S", "b", "passed"), ("S", "c", "skipped")])
        self.assertEqual(self.count(), (2, 0, 1))

    def test_shards_times_runs_are_read_and_a_failure_in_any_fails_the_case(self):
        # --runs_per_test=2 over 2 shards: "Stats over 4 runs", shard_S_of_2_run_R_of_2.
        label = "//tests/engine:gpu_staging_test"
        self.target(label, "FAILED in 1 out of 4 in 2.0s", runs=4)
        for r in (1, 2):
            self.put(label, f"shard_1_of_2_run_{r}_of_2", [("G", "a", "passed")])
            self.put(label, f"shard_2_of_2_run_{r}_of_2",
                     [("G", "b", "failed" if r == 2 else "passed"), ("G", "c", "passed")])
        # Results of an earlier layout (runs alone, 4 of them) are older and not read.
        old = [("Old", "x", "passed")]
        for r in (1, 2, 3, 4):
            self.put(label, f"run_{r}_of_4", old)
            past = os.path.join(self.logs, "tests/engine/gpu_staging_test", f"run_{r}_of_4")
            os.utime(past, (1, 1))
        self.assertEqual(self.count(), (2, 1, 0))

    def test_a_missing_shard_fails_the_target(self):
        # Two actions announced, one wrote results: its passes cannot be trusted alone.
        label = "//a:sharded"
        self.target(label, "PASSED in 0.2s", runs=2)
        self.put(label, "shard_1_of_2", [("S", "a", "passed"), ("S", "b", "passed")])
        self.assertEqual(self.count(), (0, 2, 0))

    def test_several_runs_without_any_results_fail(self):
        self.target("//a:gone", "PASSED in 0.2s", runs=2)
        self.assertEqual(self.count(), (0, 1, 0))

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


    def test_a_thread_sanitizer_report_fails_a_passing_target(self):
        # The race was in a child process (ote_target): the parent's cases all passed.
        self.target("//a:t", "PASSED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "two", "passed"), ("S", "off", "skipped")],
                    log="WARNING: ThreadSanitizer: data race (pid=12)\n")
        self.target("//a:ok", "PASSED in 0.1s", xml=[("S", "x", "passed")],
                    log="ThreadSanitizer is mentioned mid-line, not a report\n")
        self.assertEqual(self.count(), (1, 2, 1))

    def test_a_thread_sanitizer_report_of_a_failed_target_fails_all_its_cases(self):
        self.target("//a:t", "FAILED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "two", "failed")],
                    log="==9==WARNING: ThreadSanitizer: lock-order-inversion\n")
        self.assertEqual(self.count(), (0, 2, 0))

    def test_expected_skips_listed_skip_counts_skipped(self):
        self.target("//a:t", "PASSED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "nodev", "skipped"),
                         ("Conf/V", "Mw/rdma_core", "skipped"), ("Conf/V", "Mw/sim", "passed")])
        skips = ("# comment\n\nS.nodev   no device here\n"
                 "Conf/V.*/rdma_core  no RDMA NIC on the CI machines\n")
        self.assertEqual(self.count(skips), (2, 0, 2))

    def test_an_unlisted_skip_counts_failed(self):
        self.target("//a:t", "PASSED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "surprise", "skipped")])
        # The unlisted skip fails, and so do the two entries that match nothing (stale).
        self.assertEqual(self.count("S.other  a reason\nX.y  another reason\n"), (1, 3, 0))
        self.assertTrue(any("S.surprise skipped but is not in the expected skips" in d
                            for d in self.details))

    def test_a_listed_case_that_passes_counts_failed(self):
        self.target("//a:t", "PASSED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "back", "passed")])
        self.assertEqual(self.count("S.back  used to skip\n"), (1, 1, 0))
        self.assertTrue(any("is listed as skipping" in d for d in self.details))

    def test_a_case_skipping_in_only_some_runs(self):
        label = "//tests/engine:t"
        self.target(label, "PASSED in 2.0s", runs=2)
        self.put(label, "run_1_of_2", [("E", "a", "passed"), ("E", "b", "skipped")])
        self.put(label, "run_2_of_2", [("E", "a", "passed"), ("E", "b", "passed")])
        # Unlisted: it skipped in a run. Listed: it passed in a run. Failed either way.
        self.assertEqual(self.count(""), (1, 1, 0))
        self.assertEqual(self.count("E.b  sometimes\n"), (1, 1, 0))

    def test_expected_skips_per_configuration(self):
        self.target("//a:t", "PASSED in 0.1s",
                    xml=[("S", "slow", "skipped"), ("S", "nodev", "skipped")])
        skips = "[tsan] S.slow  too slow under tsan\nS.nodev  no device\n"
        self.assertEqual(self.count(skips, "tsan"), (0, 0, 2))
        self.assertEqual(self.count(skips, "default"), (0, 1, 1))
        self.assertEqual(self.count("[asan,tsan] S.slow  x\nS.nodev  y\n", "asan"), (0, 0, 2))

    def test_a_stale_entry_fails_unless_the_run_is_partial(self):
        self.target("//a:t", "PASSED in 0.1s", xml=[("S", "one", "passed")])
        skips = "Gone.case  a test that was renamed\n[asan] Other.case  asan only\n"
        self.assertEqual(self.count(skips), (1, 1, 0))
        self.assertTrue(any("'Gone.case' matches no test case" in d for d in self.details))
        self.assertEqual(self.count(skips, partial=True), (1, 0, 0))

    def test_cases_of_a_target_failed_outside_are_not_adjusted(self):
        self.target("//a:t", "FAILED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "nodev", "skipped"),
                         ("S", "listed", "passed")],
                    log="==1==ERROR: LeakSanitizer: detected memory leaks\n")
        # Still failed outside (2 failed, 1 skipped); the entries match, so none is stale.
        self.assertEqual(self.count("S.listed  x\nS.nodev  y\n"), (0, 2, 1))

    def test_a_malformed_skips_file_is_an_error(self):
        for text in ("S.case\n", "[tsan S.case reason\n", "[] S.case reason\n"):
            path = os.path.join(self.tmp.name, "bad.txt")
            with open(path, "w") as f:
                f.write(text)
            with self.assertRaises(ValueError):
                count_results.load_expected_skips(path)
        # Through the script: a crash, nothing on stdout.
        self.target("//a:t", "PASSED in 0.1s", xml=[("S", "one", "passed")])
        with open(self.console, "w") as f:
            f.write("\n".join(self.lines) + "\n")
        r = subprocess.run([sys.executable, SCRIPT, self.console, self.logs,
                            "--expected-skips", path, "--config", "tsan"],
                           capture_output=True, text=True)
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stdout.strip(), "")

    def test_the_script_checks_skips(self):
        self.target("//a:t", "PASSED in 0.1s",
                    xml=[("S", "one", "passed"), ("S", "off", "skipped")])
        with open(self.console, "w") as f:
            f.write("\n".join(self.lines) + "\n")
        path = os.path.join(self.tmp.name, "skips.txt")
        with open(path, "w") as f:
            f.write("[default] S.off  reason\n")
        run = [sys.executable, SCRIPT, self.console, self.logs, "--expected-skips", path]
        r = subprocess.run(run + ["--config", "default"], capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stdout.split()), (0, ["1", "0", "1"]))
        r = subprocess.run(run + ["--config", "asan"], capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stdout.split()), (0, ["1", "1", "0"]))
        self.assertIn("S.off skipped but is not in the expected skips", r.stderr)


if __name__ == "__main__":
    unittest.main()
