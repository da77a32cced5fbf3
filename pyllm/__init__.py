"""pyllm: fast CPU inference of language models from Python.

>>> import pyllm
>>> llm = pyllm.load("path/to/model-folder")  # doctest: +SKIP
>>> print(llm.generate("The sky is blue because", max_tokens=32).text)  # doctest: +SKIP
"""
from .errors import ContextLengthError, FormatError, PyllmError, UnsupportedModelError
from .model import Completion, Model, load

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "ContextLengthError",
    "FormatError",
    "Model",
    "PyllmError",
    "UnsupportedModelError",
    "__version__",
    "load",
]
