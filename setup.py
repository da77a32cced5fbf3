"""Builds pyllm's compiled modules: the C core (csrc/, plain C11) under Cython bindings.

csrc/ is compiled once, into a static library (build_clib), and linked into each module:
pyllm._core (the runtime), pyllm._strings (the loaders' string work) and pyllm._kernels (every
kernel on its own, for the tests). Each module so holds its own copy of the core's state, the
installed ISA among it: pyllm._kernels installs whatever pyllm._core.set_isa installs.

Nothing is compiled for the build machine's CPU: SIMD variants carry target attributes and are
chosen at run time (csrc/cpu.c), so one wheel serves every machine of its architecture.
"""
import glob
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext

if sys.platform == "win32":
    compile_args = ["/O2", "/std:c11", "/experimental:c11atomics"]
    csrc_args = compile_args
    system_libraries = []
else:
    # -fno-math-errno lets sqrtf/expf inline; it changes no result.
    compile_args = ["-O3", "-std=c11", "-Wall", "-Wextra", "-fno-math-errno"]
    # hidden: each module's copy of the core stays its own, however Python loads the modules
    csrc_args = [*compile_args, "-fvisibility=hidden"]
    system_libraries = ["m", "pthread"]

headers = sorted(glob.glob("csrc/*.h"))
csrc = ("pyllm_c", {"sources": sorted(glob.glob("csrc/*.c")), "include_dirs": ["csrc"], "cflags": csrc_args,
                    "obj_deps": {"": headers}})


class build_csrc(build_clib):
    """build_clib with its C files compiled side by side (it compiles them one after another)."""

    def build_libraries(self, libraries):
        compile_files = self.compiler.compile

        def compile_side_by_side(sources, **kwargs):
            # the first alone: a compiler's first call may set itself up (MSVC finds its tools)
            objects = compile_files(sources[:1], **kwargs)
            with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
                for more in pool.map(lambda source: compile_files([source], **kwargs), sources[1:]):
                    objects += more
            return objects

        self.compiler.compile = compile_side_by_side
        super().build_libraries(libraries)


class build_ext_on_csrc(build_ext):
    """build_ext after build_clib (`build` runs both, `build_ext --inplace` only itself), relinking a
    module whenever the library changed."""

    def run(self):
        self.run_command("build_clib")
        clib = self.get_finalized_command("build_clib")
        library = os.path.join(clib.build_clib, clib.compiler.library_filename(csrc[0]))
        for ext in self.extensions:
            ext.depends.append(library)
        super().run()


def extension(name: str) -> Extension:
    return Extension(f"pyllm.{name}", sources=[f"pyllm/{name}.pyx"], include_dirs=["csrc"], depends=list(headers),
                     extra_compile_args=compile_args, libraries=[csrc[0], *system_libraries])


setup(
    libraries=[csrc],
    ext_modules=cythonize([extension("_core"), extension("_strings"), extension("_kernels")],
                          compiler_directives={"language_level": "3"}),
    cmdclass={"build_clib": build_csrc, "build_ext": build_ext_on_csrc},
)
