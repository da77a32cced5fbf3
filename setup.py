"""Builds pyllm._core: the C core (csrc/, plain C11) under Cython bindings.

Nothing is compiled for the build machine's CPU: SIMD variants carry target attributes and are
chosen at run time (csrc/cpu.c), so one wheel serves every machine of its architecture.
"""
import glob
import sys

from Cython.Build import cythonize
from setuptools import Extension, setup

if sys.platform == "win32":
    compile_args = ["/O2", "/std:c11", "/experimental:c11atomics"]
else:
    # -fno-math-errno lets sqrtf/expf inline; it changes no result.
    compile_args = ["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-math-errno"]

core = Extension(
    "pyllm._core",
    sources=["pyllm/_core.pyx", *sorted(glob.glob("csrc/*.c"))],
    include_dirs=["csrc"],
    extra_compile_args=compile_args,
    libraries=[] if sys.platform == "win32" else ["m", "pthread"],
)

setup(ext_modules=cythonize([core], compiler_directives={"language_level": "3"}))
