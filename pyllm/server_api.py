"""The request bodies `pyllm serve` accepts, as pydantic models of OpenAI's API.

Strict types (no "1" for 1, no true for 1.0), so a wrong type is a 400 naming the parameter rather
than a silent conversion. Every field OpenAI defines is either honoured, accepted because it cannot
change the output (HARMLESS), or refused with a 400 saying it is not supported (see `_check_extras`):
nothing that would change the answer is ignored.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

# Fields that change nothing pyllm computes: identifiers and storage hints.
HARMLESS = {"user", "metadata", "store", "safety_identifier", "prompt_cache_key", "service_tier"}

# OpenAI fields pyllm does not run, each refused by name (anything else unknown is refused as unknown).
UNSUPPORTED = {"tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "audio",
               "prediction", "web_search_options", "reasoning_effort", "verbosity", "moderation",
               "prompt_cache_retention", "logprobs_options"}

NonNegative = Annotated[int, Field(ge=0)]


def unsupported(param: str, what: str | None = None) -> PydanticCustomError:
    """The validation error of a setting pyllm does not run; it names the parameter (ctx["param"])."""
    return PydanticCustomError("unsupported", "{what} is not supported by pyllm serve",
                               {"param": param, "what": what or param})


class Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")

    @model_validator(mode="after")
    def _check_extras(self):
        for name in list(self.__pydantic_extra__ or {}):
            if name in HARMLESS:
                continue
            if name in UNSUPPORTED:
                raise unsupported(name)
            raise PydanticCustomError("unknown", "unrecognized request argument supplied: {param}",
                                      {"param": name})
        return self


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = False
    include_obfuscation: bool = False  # padding OpenAI adds to chunks; pyllm adds none


class Sampling(Request):
    """The sampling and stopping settings chat and completions share; top_k, min_p and
    repetition_penalty are pyllm's extras (extra_body with the openai client)."""

    model: str
    max_tokens: NonNegative | None = None
    n: Annotated[int, Field(ge=1, le=16)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Union[str, Annotated[list[str], Field(max_length=16)], None] = None
    seed: NonNegative | None = None
    # OpenAI's defaults: temperature 1 samples. Pass 0 for greedy decoding.
    temperature: float = 1.0
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    top_k: NonNegative = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    # "developer" is OpenAI's new name for "system"; it is rendered as a system message.
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[TextPart]]
    name: str | None = None

    def as_dict(self) -> dict:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content}


class ResponseFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")
    type: str


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: NonNegative | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    modalities: list[Literal["text"]] | None = None

    @model_validator(mode="after")
    def _check_format(self):
        if self.response_format is not None and self.response_format.type != "text":
            raise unsupported("response_format", f"response_format of type {self.response_format.type!r} "
                                                 f"(only \"text\")")
        return self


Prompt = Union[str, Annotated[list[str], Field(min_length=1)], Annotated[list[NonNegative], Field(min_length=1)],
               Annotated[list[Annotated[list[NonNegative], Field(min_length=1)]], Field(min_length=1)]]


class CompletionRequest(Sampling):
    prompt: Prompt
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None

    @model_validator(mode="after")
    def _check_unsupported(self):
        if self.echo:
            raise unsupported("echo", "echo (the prompt repeated in the completion)")
        if self.suffix:
            raise unsupported("suffix", "suffix (insertion)")
        if self.best_of is not None and self.best_of != self.n:
            raise unsupported("best_of", "best_of other than n")
        return self


class EmbeddingRequest(Request):
    model: str
    input: Union[str, Annotated[list[str], Field(min_length=1)], Annotated[list[NonNegative], Field(min_length=1)],
                 Annotated[list[Annotated[list[NonNegative], Field(min_length=1)]], Field(min_length=1)]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None
