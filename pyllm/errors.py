"""The exception hierarchy: every error pyllm raises on purpose is a PyllmError."""


class PyllmError(Exception):
    """Base class of every pyllm error."""


class FormatError(PyllmError, ValueError):
    """A model file is malformed: truncated, corrupt, or describing data it does not hold."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class UnsupportedModelError(PyllmError):
    """The file is well formed but describes an architecture, dtype or option pyllm does not run."""


class ContextLengthError(PyllmError, ValueError):
    """A prompt (or prompt plus cache) does not fit in the model's context."""


class TokenizerError(PyllmError, ValueError):
    """The tokenizer failed on a text: a pattern of its file gave up (a regex that backtracks without
    end), or another failure inside the tokenizers library."""


class QueueFullError(PyllmError):
    """A scheduler already holds as many waiting requests as it was told to queue."""


class ChatTemplateError(PyllmError):
    """A chat template failed: bad syntax, a raise_exception() call (its message verbatim), an
    unsafe operation blocked by the sandbox, or any other error while rendering."""
