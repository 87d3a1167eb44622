"""Only here because cffi's build hook is a setup() keyword; everything else is in pyproject.toml."""
from setuptools import setup

setup(cffi_modules=["runtime/paging/native/build.py:ffibuilder"])
