"""What pyllm runs with on this machine: the CPU's SIMD features, the kernel set (ISA) in use, the
BLAS, the default thread count and the versions. `pyllm info --system` prints it.

The C core picks its kernels at import (csrc/cpu.c): the best ISA this CPU and OS support. The
environment variable PYLLM_ISA names another (scalar, avx2, avx512 or neon; empty or "best" keeps
the default), to measure one kernel set or to take SIMD out of the picture while hunting a bug:

    PYLLM_ISA=scalar pyllm run smollm2 "The sky is"

A name pyllm does not know, or an ISA the CPU cannot run, is a RuntimeWarning and changes nothing.
"""
from __future__ import annotations

import ctypes
import os
import platform
import warnings

from . import _core
from .version import __version__

ISAS = tuple(_core.ISA_NAMES.values())  # by number: scalar first
ISA_ENV = "PYLLM_ISA"

# The CPU flags the ISAs need, as Linux names them in /proc/cpuinfo (cpu.c asks the CPU itself, and
# the OS for the registers). asimddp is the dot-product extension the NEON quant kernels use when
# the core is compiled for it.
_CPU_FLAGS = {
    "x86_64": ("avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"),
    "aarch64": ("asimd", "fphp", "asimdhp", "asimddp"),
}


def apply_isa_override(environ=None) -> str | None:
    """Installs the kernels PYLLM_ISA names and returns that name. Returns None and changes nothing
    where it names none (unset, empty, "best"), and so with a RuntimeWarning where it names an ISA
    pyllm does not know or this CPU cannot run. Called at import."""
    environ = os.environ if environ is None else environ
    value = environ.get(ISA_ENV, "").strip().lower()
    current = _core.current_isa()
    if value in ("", "best"):
        return None
    if value not in ISAS:
        warnings.warn(f"{ISA_ENV}={value!r} is none of {', '.join(ISAS)} or best: the {current} kernels stay",
                      RuntimeWarning, stacklevel=2)
        return None
    if _core.set_isa(value) != value:
        _core.set_isa(current)
        warnings.warn(f"{ISA_ENV}={value}: this CPU cannot run the {value} kernels; the {current} ones stay",
                      RuntimeWarning, stacklevel=2)
        return None
    return value


def supported_isas() -> list[str]:
    """Every ISA this CPU runs, scalar first. Installs each in turn, then the one in use again: call it
    between forwards, never while a model runs."""
    current = _core.current_isa()
    try:
        return [name for name in ISAS if _core.set_isa(name) == name]
    finally:
        _core.set_isa(current)


def _cpuinfo() -> dict[str, str]:
    """The first processor's entries of /proc/cpuinfo ({} where there is none)."""
    entries: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    if entries:
                        break
                    continue
                key, _, value = line.partition(":")
                entries.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return entries


def _machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def cpu_lines() -> list[str]:
    """The CPU, the flags the ISAs need that it has and lacks, and the ISA in use."""
    info = _cpuinfo()
    name = info.get("model name") or platform.processor() or _machine()
    lines = [f"cpu:             {name} ({_machine()}, {os.cpu_count() or '?'} logical CPUs)"]
    wanted = _CPU_FLAGS.get(_machine(), ())
    flags = set((info.get("flags") or info.get("Features") or "").split())
    if wanted and flags:
        have = [f for f in wanted if f in flags]
        lacks = [f for f in wanted if f not in flags]
        lines.append(f"cpu flags:       {' '.join(have) or 'none of the SIMD ones'}"
                     + (f" (lacks {' '.join(lacks)})" if lacks else "") + ", as /proc/cpuinfo lists them")
    current, best = _core.current_isa(), _core.best_isa()
    lines.append(f"kernels:         {', '.join(supported_isas())} run here; the best is {best}")
    value = os.environ.get(ISA_ENV, "").strip()
    if value and value.lower() == current:
        why = f"{ISA_ENV}={value}; " + ("also the best" if current == best else f"the best is {best}")
    elif current != best:
        why = f"installed by pyllm._core.set_isa; the best is {best}"
    elif value and value.lower() != "best":
        why = f"the best; {ISA_ENV}={value} is ignored: an unknown name, or an ISA this CPU cannot run"
    else:
        why = f"the best; {ISA_ENV}={'|'.join(ISAS)} picks another"
    lines.append(f"kernels in use:  {current} ({why})")
    return lines


def _openblas() -> tuple[str, str, str] | None:
    """(library path, configuration, core) of the OpenBLAS whose thread count the core controls
    (the one pyllm.blas finds), or None."""
    from . import blas

    for path in blas.candidate_libraries():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in blas._PREFIXES:
            if not hasattr(lib, prefix + "set_num_threads"):
                continue
            texts = []
            for name in ("get_config", "get_corename"):
                fn = getattr(lib, prefix + name, None)
                if fn is None:
                    texts.append("")
                    continue
                fn.restype = ctypes.c_char_p
                texts.append((fn() or b"").decode("utf-8", "replace"))
            return path, texts[0], texts[1]
    return None


def blas_lines() -> list[str]:
    """SciPy's BLAS (its sgemm does prefill), and whether pyllm controls its threads."""
    import scipy
    import scipy.linalg.cython_blas  # noqa: F401  (loads the library)

    try:
        dep = scipy.show_config(mode="dicts")["Build Dependencies"]["blas"]
        built = f"{dep['name']} {dep.get('version', '')}".strip()
    except (TypeError, KeyError, AttributeError):  # SciPy before 1.11 has no dicts
        built = "unknown"
    found = _openblas()
    if found is None:
        return [f"blas:            SciPy's ({built}); its thread count is not pyllm's to set: prefill calls "
                f"sgemm from one thread and the BLAS threads itself"]
    path, config, core = found
    return [f"blas:            SciPy's {built}: {config or 'OpenBLAS'}" + (f", core {core}" if core else ""),
            f"blas library:    {path} (prefill: sgemm on each of pyllm's threads, one BLAS thread each)"]


def thread_lines() -> list[str]:
    from .threads import decode_candidates, default_threads, physical_cores

    env = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if env.isdigit() and int(env) > 0:
        why = f"OMP_NUM_THREADS={env}"
    else:
        why = f"the physical cores this process may use ({physical_cores()}); OMP_NUM_THREADS sets another"
    n = default_threads()
    tried = ", ".join(map(str, decode_candidates(n)))
    return [f"threads:         {n} by default: {why}",
            f"decode threads:  measured per model over its first decode steps, the fastest of {tried}"]


def version_lines() -> list[str]:
    import numpy
    import scipy

    return [f"pyllm:           {__version__} ({os.path.dirname(os.path.abspath(__file__))})",
            f"python:          {platform.python_version()} ({platform.python_implementation()}), "
            f"{platform.system()} {_machine()}",
            f"numpy:           {numpy.__version__}",
            f"scipy:           {scipy.__version__}"]


def system_lines() -> list[str]:
    """What `pyllm info --system` prints.

    >>> print("\\n".join(pyllm.system.system_lines()))  # doctest: +SKIP
    pyllm:           0.1.0 (/…/site-packages/pyllm)
    …
    kernels in use:  avx2 (the best; PYLLM_ISA=scalar|avx2|avx512|neon picks another)
    """
    return version_lines() + cpu_lines() + blas_lines() + thread_lines()

