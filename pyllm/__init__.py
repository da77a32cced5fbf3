"""pyllm: fast CPU inference of language models from Python.

>>> import pyllm
>>> llm = pyllm.load("path/to/model-folder")  # doctest: +SKIP
>>> print(llm.generate("The sky is blue because", max_tokens=32).text)  # doctest: +SKIP
"""
import glob as _glob
import os as _os

try:
    from . import _core  # noqa: F401  (the compiled core, which model.py needs)
except ImportError as _e:
    _here = _os.path.dirname(_os.path.abspath(__file__))
    if not _glob.glob(_os.path.join(_here, "_core*.so")) + _glob.glob(_os.path.join(_here, "_core*.pyd")):
        # Python found this folder before the installed package: a source tree, never built in place.
        raise ImportError(
            f"pyllm's compiled core is not built in {_here}: that source tree, first on sys.path (the "
            f"current folder?), shadows the installed pyllm. Run Python from another folder, or build "
            f"in place with `pip install -e .`") from _e
    raise

from .system import apply_isa_override as _apply_isa_override

_apply_isa_override()  # PYLLM_ISA=scalar|avx2|avx512|neon replaces the best kernels (pyllm/system.py)

from .batch_jobs import batch
from .chat import ChatMessageError, ChatTemplateError
from .errors import ContextLengthError, FormatError, PyllmError, TokenizerError, UnsupportedModelError
from .generation import Completion, Stream
from .loader import load
from .model import Model
from .sampling import SamplingParams, SamplingParamsError
from .version import __version__

__all__ = [
    "batch",
    "ChatMessageError",
    "ChatTemplateError",
    "Completion",
    "ContextLengthError",
    "FormatError",
    "Model",
    "PyllmError",
    "SamplingParams",
    "SamplingParamsError",
    "Stream",
    "TokenizerError",
    "UnsupportedModelError",
    "__version__",
    "load",
]
