"""Test macros shared by the packages under //tests."""

_TEST_BASE = "//tests/util:test_base"
_GTEST_MAIN = "@gtest//:gtest_main"

def ote_cc_test(name, srcs, deps = [], size = "small", **kwargs):
    """A GoogleTest cc_test that links the shared fixture and gtest_main.

    Adds //tests/util:test_base (the OteTest fixture: fd leak, scoped ERROR log and
    retained-owner checks) and @gtest//:gtest_main to deps; everything else is passed to cc_test as given.
    """
    native.cc_test(
        name = name,
        size = size,
        srcs = srcs,
        deps = deps + [d for d in [_TEST_BASE, _GTEST_MAIN] if d not in deps],
        **kwargs
    )
