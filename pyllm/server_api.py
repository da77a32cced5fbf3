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
UNSUPPORTED = {"functions", "function_call", "audio",
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


class FunctionCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    # "developer" is OpenAI's new name for "system"; it is rendered as a system message.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # None only for an assistant turn that calls tools
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None           # the call a "tool" message answers
    refusal: str | None = None                # sent back by clients that echo a reply as it came

    @model_validator(mode="after")
    def _check_content(self):
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError("missing_content", "a {role} message needs content", {"role": self.role})
        return self

    def as_dict(self) -> dict:
        content = (self.content if self.content is None or isinstance(self.content, str)
                   else "".join(p.text for p in self.content))
        message = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:
            message["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: str
    schema_: dict | None = Field(None, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """{"type": "text"}, {"type": "json_object"} (any JSON object) or {"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}}: the reply matches it (pyllm.constraints)."""
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check_schema(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise PydanticCustomError("json_schema", "response_format json_schema goes with type \"json_schema\"",
                                      {"param": "response_format"})
        return self

    def schema(self) -> dict | None:
        """The JSON schema the reply must match; None for plain text."""
        if self.type == "json_object":
            return {"type": "object"}
        if self.type == "json_schema":
            return self.json_schema.schema_ or {"type": "object"}
        return None


class FunctionDef(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["function"]
    function: ChosenFunction


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: NonNegative | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    modalities: list[Literal["text"]] | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=128)] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool = True

    @model_validator(mode="after")
    def _check_tools(self):
        names = [t.function.name for t in self.tools or []]
        if self.tool_choice not in (None, "none") and not names:
            raise PydanticCustomError("tools", "tool_choice needs tools", {"param": "tool_choice"})
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise PydanticCustomError("tools", "tool_choice names a function that is not in tools",
                                      {"param": "tool_choice"})
        if names and self.tool_choice != "none" and self.response_format and self.response_format.schema():
            raise unsupported("response_format", "response_format together with tools")
        return self


Prompt = Union[str, Annotated[list[str], Field(min_length=1)], Annotated[list[NonNegative], Field(min_length=1)],
               Annotated[list[Annotated[list[NonNegative], Field(min_length=1)]], Field(min_length=1)]]


class CompletionRequest(Sampling):
    prompt: Prompt
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None
    response_format: ResponseFormat | None = None

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
