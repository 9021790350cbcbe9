"""Test macros shared by the packages under //tests."""

_TEST_BASE = "//tests/util:test_base"
_GTEST_MAIN = "@gtest//:gtest_main"
_TSAN_SUPP = "//tests:tsan.supp"

def ote_cc_test(name, srcs, deps = [], data = [], size = "small", **kwargs):
    """A GoogleTest cc_test that links the shared fixture and gtest_main.

    Adds //tests/util:test_base (the OteTest fixture: fd leak, scoped ERROR log and
    retained-owner checks) and @gtest//:gtest_main to deps, and //tests:tsan.supp to data
    (the tsan configuration's TSAN_OPTIONS name it relative to the runfiles directory);
    everything else is passed to cc_test as given.
    """
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        data = data + [_TSAN_SUPP],
        deps = deps + [d for d in [_TEST_BASE, _GTEST_MAIN] if d not in deps],
        **kwargs
    )
