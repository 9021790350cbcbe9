"""The wheel carries liborbitte.so, a Linux x86-64 shared library, so it must not be tagged
pure ("py3-none-any"): the binding is ctypes, so any CPython 3 and no ABI tag
("py3-none-linux_x86_64"). Everything else is in pyproject.toml."""

from setuptools import setup
from setuptools.dist import Distribution


class BinaryDistribution(Distribution):
    """Platform-specific: the package holds a native library (installed to platlib)."""

    def has_ext_modules(self):
        return True


cmdclass = {}
try:
    from wheel.bdist_wheel import bdist_wheel

    class PlatformWheel(bdist_wheel):
        def get_tag(self):
            _python, _abi, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = PlatformWheel
except ImportError:  # building an sdist only
    pass

setup(distclass=BinaryDistribution, cmdclass=cmdclass)
