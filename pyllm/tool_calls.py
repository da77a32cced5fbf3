"""OpenAI tool calls through a model's own chat template: which call format the template teaches the
model, a grammar that keeps every call valid JSON of its function's parameter schema, and the
calls parsed back out of the text.

    Qwen2.5 / Qwen3 (Hermes style)  <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, one per call
    Llama 3.1 / 3.2 / 3.3           {"name": ..., "parameters": {...}}, one call
    Mistral (Nemo, Small)           [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], [TOOL_CALLS] the
                                    control token; call ids of 9 letters and digits, as its template demands
    Phi-4-mini                      <|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>, both
                                    control tokens; its template reads the tools from the system message
                                    and an assistant turn from its content alone (call_messages)

A template that mentions no tools is refused (ToolsUnsupported) rather than given a prompt the model
was not taught.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from .constraints import output_grammar
from .errors import PyllmError


class ToolsUnsupported(PyllmError, ValueError):
    """The model's chat template has no tool calls pyllm can prompt for and parse."""


@dataclass(frozen=True)
class ToolFormat:
    name: str
    prefix: str         # before each call's JSON
    suffix: str         # after it
    separator: str      # between parallel calls
    arguments: str      # the key of the call's arguments
    parallel: bool      # the template renders several calls in one turn
    marker: str         # the text that begins the calls: free text ("auto") never holds it
    opening: str = ""   # llguidance Lark before the calls (a special token: <[id]>)
    closing: str = ""   # and after them
    id_chars: int = 0   # call ids of exactly this many letters and digits (0: OpenAI's call_...)

    def may_call(self, text: str) -> bool:
        """Whether a reply beginning with text may still be calls (free text never starts so)."""
        return text.startswith(self.marker) or self.marker.startswith(text)

    def call_id(self) -> str:
        return uuid.uuid4().hex[:self.id_chars] if self.id_chars else "call_" + uuid.uuid4().hex[:24]


QWEN = ToolFormat("qwen", "<tool_call>\n", "\n</tool_call>", "\n", "arguments", True, "<tool_call>")
LLAMA3 = ToolFormat("llama3", "", "", "", "parameters", False, "{")  # only a reply that starts with it
MISTRAL_CALLS = "[TOOL_CALLS]"
PHI_CALLS, PHI_END = "<|tool_call|>", "<|/tool_call|>"
PHI_SYSTEM = "You are a helpful assistant with some tools."  # Phi-4-mini's model card, when none is given


def _control_token(tokenizer, text: str) -> int:
    token = tokenizer.hf.token_to_id(text) if tokenizer is not None else None
    if token is None:
        raise ToolsUnsupported(f"this model's chat template calls tools with {text}, "
                               f"which its vocabulary has no token for")
    return token


def template_format(template: str | None, tokenizer=None) -> ToolFormat:
    """The call format a chat template asks for; ToolsUnsupported when it has none pyllm parses.
    Mistral's and Phi's need the tokenizer, for their control tokens."""
    template = template or ""
    if "<tool_call>" in template and "tools" in template:
        return QWEN
    if '"parameters": ' in template and "ipython" in template:
        return LLAMA3
    if MISTRAL_CALLS in template:
        return ToolFormat("mistral", "", "", ", ", "arguments", True, MISTRAL_CALLS,
                          f'<[{_control_token(tokenizer, MISTRAL_CALLS)}]> "["', '"]"', 9)
    if "<|tool|>" in template and "tools" in template:  # Phi-4-mini: tools between <|tool|> and <|/tool|>
        return ToolFormat("phi", "", "", ", ", "arguments", True, PHI_CALLS,
                          f'<[{_control_token(tokenizer, PHI_CALLS)}]> "["',
                          f'"]" <[{_control_token(tokenizer, PHI_END)}]>')
    raise ToolsUnsupported("this model's chat template has no tool support: it cannot be given tools")


def _parameters(tool: dict) -> dict:
    return tool["function"].get("parameters") or {"type": "object", "properties": {}}


def _rooted(schema, at: str):
    """schema with its local references ("#/$defs/X", "#") pointing below `at` instead of the root:
    a function's parameters sit inside the call's schema, where their own "#" is not the root."""
    if isinstance(schema, dict):
        return {k: at + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else _rooted(v, at)
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [_rooted(v, at) for v in schema]
    return schema


def calls_grammar(tools: list[dict], fmt: ToolFormat, choice, parallel: bool) -> str | None:
    """llguidance's grammar for the reply: tool calls only (choice "required" or a named function),
    free text or tool calls ("auto"), or no constraint (None, for "none")."""
    if choice == "none":
        return None
    if isinstance(choice, dict):
        tools = [t for t in tools if t["function"]["name"] == choice["function"]["name"]]
    # each function's parameters under $defs, their $refs (to their own $defs) rewritten to match
    call = {"$defs": {f"f{i}": _rooted(_parameters(t), f"#/$defs/f{i}") for i, t in enumerate(tools)},
            "oneOf": [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                        fmt.arguments: {"$ref": f"#/$defs/f{i}"}},
                       "required": ["name", fmt.arguments], "additionalProperties": False}
                      for i, t in enumerate(tools)],
            # spaced as the templates write calls back (`tojson`), as the model was taught them
            "x-guidance": {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}}
    several = parallel and fmt.parallel
    call_rule = f"{json.dumps(fmt.prefix)} body {json.dumps(fmt.suffix)}" if fmt.prefix else "body"
    calls = "call (SEP call)*" if several else "call"
    if fmt.opening or fmt.closing:
        calls = f"{fmt.opening} {calls} {fmt.closing}"
    lines = [f"start: {'calls | TEXT' if choice == 'auto' else 'calls'}",
             f"calls: {calls}",
             f"call: {call_rule}",
             f"body: %json {json.dumps(call)}"]
    if several:
        lines.append(f"SEP: {json.dumps(fmt.separator)}")
    if choice == "auto":  # a reply is free text or calls, never text with unconstrained calls in it
        anywhere = "" if fmt is LLAMA3 else ".*"
        lines.append(f"TEXT: /(?s:.+)/ & ~/(?s:{anywhere}{re.escape(fmt.marker)}.*)/")
    lark = "\n".join(lines) + "\n"
    return output_grammar(grammar=lark)


def parse_calls(text: str, fmt: ToolFormat) -> tuple[str | None, list[dict]]:
    """(the content before the calls or None, OpenAI's tool_calls); no calls: (text, [])."""
    try:
        if fmt is QWEN:
            found = [json.loads(b) for b in re.findall(r"<tool_call>\s*(.*?)\s*</tool_call>", text, re.S)]
            content = text.split("<tool_call>", 1)[0].strip() or None
        elif fmt is LLAMA3:
            found, content = ([json.loads(text)] if text.lstrip().startswith("{") else []), None
        else:  # a JSON list after the marker (and Phi's closing token after the list)
            before, marker, after = text.partition(fmt.marker)
            found, content = (json.JSONDecoder().raw_decode(after)[0] if marker else []), before.strip() or None
    except ValueError:
        return text, []
    if not isinstance(found, list) or not all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                              for c in found):
        return text, []
    calls = [{"id": fmt.call_id(), "type": "function",
              "function": {"name": c["name"], "arguments": json.dumps(c.get(fmt.arguments, {}), ensure_ascii=False)}}
             for c in found]
    return (content, calls) if calls else (text, [])


def _object_end(text: str, start: int) -> int:
    """Where the JSON object (or array) that begins at text[start] ends, or len(text) while it is
    still open."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


class CallStream:
    """A reply that is tool calls, streamed as OpenAI streams them: deltas(text) takes the reply so
    far and gives the delta.tool_calls entries it adds: a call's index, id, type and name (arguments
    "") once its name is written, then its arguments piece by piece as the model writes them. The
    grammar writes each call as {"name": "...", "<arguments>": {...}}, in that order and spacing."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        self.start = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), ' + re.escape(json.dumps(fmt.arguments)) + ": ")
        self.sent: list[int] = []  # each call's characters of arguments sent

    def deltas(self, text: str) -> list[dict]:
        out, pos, index = [], 0, 0
        while (found := self.start.search(text, pos)) is not None:
            pos = _object_end(text, found.end())
            arguments = text[found.end():pos]
            if index == len(self.sent):
                self.sent.append(0)
                out.append({"index": index, "id": self.fmt.call_id(), "type": "function",
                            "function": {"name": json.loads(found.group(1)), "arguments": ""}})
            if len(arguments) > self.sent[index]:
                out.append({"index": index, "function": {"arguments": arguments[self.sent[index]:]}})
                self.sent[index] = len(arguments)
            index += 1
        return out


def template_message(message: dict) -> dict:
    """An OpenAI message as chat templates read it: a tool call's arguments as a dict (OpenAI sends
    a JSON string; templates write `arguments | tojson`)."""
    if not message.get("tool_calls"):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = dict(call.get("function") or {})
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except ValueError:
                pass
        calls.append({**call, "function": function})
    return {**message, "tool_calls": calls}


def call_messages(messages: list[dict], fmt: ToolFormat | None, tools: list[dict] | None) -> list[dict]:
    """messages as a template that renders no tools or tool calls of its own reads them: Phi-4-mini's
    takes the tools from the system message ("tools", a JSON list of the functions) and an assistant
    turn from its content, so the tools go there and a turn's calls into its content as the model
    writes them. For Model.chat_ids(prepare=...): its messages' texts are shielded by then, so the
    control tokens written here stay special (tools: shielded too). Other formats: messages as they are."""
    if fmt is None or fmt.name != "phi":
        return messages
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"].get("arguments", {})}
                     for c in m["tool_calls"]]
            m = {**m, "content": (m.get("content") or "") + PHI_CALLS + json.dumps(calls, ensure_ascii=False) + PHI_END}
        out.append(m)
    if tools:
        listed = json.dumps([t["function"] for t in tools], ensure_ascii=False)
        if not out or out[0]["role"] != "system":
            out.insert(0, {"role": "system", "content": PHI_SYSTEM})
        out[0] = {**out[0], "tools": listed}
    return out
