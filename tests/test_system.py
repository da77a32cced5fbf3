"""`pyllm info --system` (pyllm/system.py) describes the machine without loading a model, and
PYLLM_ISA picks the kernel set at import."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy
import pytest
import scipy

import pyllm
from pyllm import _core, system


def pyllm_process(*args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("PYLLM_ISA", "OMP_NUM_THREADS")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True,
                          env={**environ, **env})


@pytest.fixture
def restore_isa():
    before = _core.current_isa()
    yield
    _core.set_isa(before)


def test_info_system_describes_the_machine_and_loads_no_model(tmp_path):
    out = pyllm_process("-m", "pyllm", "info", str(tmp_path / "no-such-model"), "--system",
                        OMP_NUM_THREADS="3").stdout
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in out.splitlines() if ":" in line}
    assert lines["pyllm"].startswith(pyllm.__version__)
    assert lines["numpy"] == numpy.__version__ and lines["scipy"] == scipy.__version__
    best = _core.best_isa()
    assert lines["kernels"] == f"{', '.join(system.supported_isas())} run here; the best is {best}"
    assert lines["kernels in use"].startswith(f"{best} (the best;")
    assert lines["threads"].startswith("3 by default: OMP_NUM_THREADS=3")
    assert lines["decode threads"].endswith("the fastest of 3, 2, 1")
    assert "blas" in lines and "cpu" in lines
    if sys.platform.startswith("linux"):
        assert "scipy-openblas" in lines["blas"] and "blas library" in lines


def test_pyllm_isa_scalar_installs_the_scalar_kernels_at_import():
    code = "import pyllm, pyllm._core as c, pyllm.system as s; print(c.current_isa()); print(*s.cpu_lines(), sep='\\n')"
    out = pyllm_process("-c", code, PYLLM_ISA="scalar").stdout.splitlines()
    assert out[0] == "scalar"
    assert any(line.startswith("kernels in use:  scalar (PYLLM_ISA=scalar; ") for line in out), out


def test_pyllm_isa_naming_what_cannot_run_warns_and_keeps_the_kernels(restore_isa):
    # an unknown name, and every ISA this CPU lacks (there is always one: NEON or the x86 ones)
    lacking = [isa for isa in _core.ISA_NAMES.values() if isa not in system.supported_isas()]
    assert lacking
    before = _core.current_isa()
    for value in ["sse9"] + lacking:
        with pytest.warns(RuntimeWarning, match=f"PYLLM_ISA.*{before}"):
            assert system.apply_isa_override({"PYLLM_ISA": value}) is None
        assert _core.current_isa() == before


@pytest.mark.parametrize("value", ["", "best", " Best "])
def test_pyllm_isa_empty_or_best_changes_nothing(value, restore_isa):
    _core.set_isa("scalar")
    assert system.apply_isa_override({"PYLLM_ISA": value}) is None
    assert _core.current_isa() == "scalar"


def test_pyllm_isa_accepts_every_isa_the_cpu_runs(restore_isa):
    for isa in system.supported_isas():
        assert system.apply_isa_override({"PYLLM_ISA": isa.upper()}) == isa
        assert _core.current_isa() == isa


def test_supported_isas_leaves_the_kernels_in_use(restore_isa):
    _core.set_isa("scalar")
    assert system.supported_isas()[0] == "scalar" and _core.best_isa() in system.supported_isas()
    assert _core.current_isa() == "scalar"


def test_a_quantized_model_runs_without_loading_scipys_blas(smollm2_gguf, family_checkpoint):
    """sgemm serves only models whose every matrix is float: a quantized one never imports SciPy
    (its OpenBLAS is ~30 MB resident, with a thread pool of its own); a float one does."""
    code = ("import sys, pyllm; llm = pyllm.load(sys.argv[1], threads=2); llm.generate('Hi', max_tokens=2); "
            "print('scipy' in sys.modules)")
    quantized = pyllm_process("-c", code, smollm2_gguf)
    assert quantized.stdout.strip() == "False", quantized.stderr
    floating = pyllm_process("-c", code, family_checkpoint("llama"))
    assert floating.stdout.strip() == "True", floating.stderr


def test_jinja2_comes_with_the_first_chat_template_not_with_loading(smollm2_gguf):
    """jinja2 is ~7 MB resident: loading and generating leave it out; the first chat renders with it."""
    code = ("import sys, pyllm; llm = pyllm.load(sys.argv[1], threads=2); llm.generate('Hi', max_tokens=2); "
            "print('jinja2' in sys.modules); llm.chat([{'role': 'user', 'content': 'Hi'}], max_tokens=2); "
            "print('jinja2' in sys.modules)")
    out = pyllm_process("-c", code, smollm2_gguf)
    assert out.stdout.split() == ["False", "True"], out.stderr
