"""Inductor compiles CPU code with a C++ compiler: a test that runs inductor on CPU carries ``needs_cxx``, which
skips it, saying what to install, where none is found."""

from __future__ import annotations

import os
import shutil

import pytest

needs_cxx = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None,
    reason="inductor needs a C++ compiler for CPU code: install g++ (or point CXX at one)",
)
