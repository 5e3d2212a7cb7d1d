"""The package's one compiled part; everything else is in pyproject.toml.

The recorder's column coder in C (zeromon/model/_planes.c) is built where a C compiler and Python's headers are:
optional, so that an install without them succeeds, and the recordings it writes are the same bytes, coded by
numpy (zeromon/model/column_arrays.py). Here rather than in pyproject.toml's ``[tool.setuptools.ext-modules]``,
which setuptools still calls experimental.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("zeromon.model._planes", ["zeromon/model/_planes.c"], optional=True)])
