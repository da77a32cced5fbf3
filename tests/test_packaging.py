"""How pyllm is packaged and imported: the license it declares and ships, a setuptools floor that
can build that declaration, and what `import pyllm` says from a source tree that was never built."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from packaging.requirements import Requirement
from packaging.version import Version
from setuptools.config.pyprojecttoml import apply_configuration, load_file
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_license_file_holds_the_mit_text_of_the_pyllm_developers():
    with open(os.path.join(ROOT, "LICENSE"), encoding="utf-8") as f:
        text = f.read()
    assert text.startswith("MIT License\n\nCopyright (c) the pyllm developers\n")
    assert "Permission is hereby granted, free of charge, to any person obtaining a copy" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text


def test_the_build_asks_for_a_setuptools_that_takes_the_license_expression():
    """license = "MIT" is a PEP 639 expression: setuptools 77 is the first to take it (68 and 76
    fail validation, wanting a {text = ...} table), so the floor must be 77."""
    pyproject = load_file(os.path.join(ROOT, "pyproject.toml"))
    requirement = next(Requirement(r) for r in pyproject["build-system"]["requires"]
                       if Requirement(r).name == "setuptools")
    floor = min(Version(s.version) for s in requirement.specifier if s.operator in (">=", "=="))
    assert floor >= Version("77")
    dist = apply_configuration(Distribution(), os.path.join(ROOT, "pyproject.toml"))
    assert dist.metadata.license_expression == "MIT"
    assert dist.metadata.license_files == ["LICENSE"]


def test_import_from_a_source_tree_without_its_built_core_says_what_is_wrong(tmp_path):
    """The clone after `pip install .`: Python run inside it finds ./pyllm, which has no _core.
    (This checkout is installed in editable mode, whose finder would hand over its own _core: it is
    taken off sys.meta_path, as a plain install has none.)"""
    tree = tmp_path / "clone"
    shutil.copytree(os.path.join(ROOT, "pyllm"), tree / "pyllm",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tree)
    code = ("import sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in getattr(f, '__name__', '')]\n"
            "import pyllm\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert (f"ImportError: pyllm's compiled core is not built in {tree / 'pyllm'}: that source tree, first "
            f"on sys.path (the current folder?), shadows the installed pyllm") in out.stderr
    assert "pip install -e ." in out.stderr and "circular import" not in out.stderr.splitlines()[-1]
