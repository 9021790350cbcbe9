"""The package's version: the library's, OTE_VERSION_MAJOR.MINOR.PATCH of <ote/ote.h>
(python/tests/test_library.py checks that they agree with ote_version())."""

__version__ = "1.0.0"
