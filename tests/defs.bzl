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

def ote_cc_test_cases(name, srcs, deps = []):
    """The cases of a suite that several tests run, compiled once.

    A testonly cc_library (alwayslink, so that every TEST registers) of srcs with the
    shared fixture and GoogleTest; each ote_cc_test that runs the suite (the same cases
    under another environment: a sim device profile, a transport) has srcs = [] and this
    library in deps. Without it every such test compiled its own copy of the source, the
    heaviest step of a CI build.
    """
    native.cc_library(
        name = name,
        testonly = True,
        srcs = srcs,
        deps = deps + [d for d in [_TEST_BASE, "@gtest//:gtest"] if d not in deps],
        alwayslink = True,
    )
