"""pyllm: fast CPU inference of language models from Python.

>>> import pyllm
>>> llm = pyllm.load("path/to/model-folder")  # doctest: +SKIP
>>> print(llm.generate("The sky is blue because", max_tokens=32).text)  # doctest: +SKIP
"""
from .chat import ChatMessageError, ChatTemplateError
from .errors import ContextLengthError, FormatError, PyllmError, UnsupportedModelError
from .generation import Completion, Stream
from .model import Model, load
from .sampling import SamplingParams, SamplingParamsError

__version__ = "0.1.0"

__all__ = [
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
    "UnsupportedModelError",
    "__version__",
    "load",
]
