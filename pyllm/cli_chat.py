"""`pyllm chat`: an interactive conversation on the terminal.

A message is one line, or several: pasted text on a terminal whose readline knows bracketed paste
arrives whole, a line ending in a backslash continues on the next, and a message opened with \"\"\"
runs to the line that ends with \"\"\". A line starting with / is a command (/help lists them) and is
never sent to the model; // starts a message with a single /.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from .errors import PyllmError

HELP = """\
/help                 this list
/exit                 quit (or Ctrl-D)
/reset                clear the conversation (the --system prompt stays)
/set                  show the sampling settings
/set NAME VALUE       change one: temperature, top_k, top_p, min_p, repetition_penalty, seed (VALUE
                      "none" clears it), max_tokens
/save FILE            write the conversation to FILE as JSON (OpenAI's messages)
/load FILE            continue the conversation saved in FILE
Messages: a line ending in \\ continues on the next; \"\"\" opens a message that runs to the line
ending in \"\"\"; on a terminal a pasted text is one message. Ctrl-C stops an answer."""

SETTINGS = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "repetition_penalty": float,
            "seed": int, "max_tokens": int}


def read_template(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise PyllmError(f"cannot read --chat-template {path}: {e}") from None


def chat_template(args: argparse.Namespace, llm) -> str | None:
    """The template to chat with (--chat-template FILE, else the model's own), tried on a first
    message so that a missing or broken one is reported before the user types anything."""
    template = read_template(args.chat_template) if args.chat_template else None
    if template is None and not llm.tokenizer.chat_template:
        raise PyllmError(f"{llm.source} has no chat template: give one with --chat-template FILE "
                         f"(a Jinja file, such as a Hugging Face model's chat_template.jinja)")
    first = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": "Hello"}]
    llm.render_chat(first, template)
    return template


def _prompt_size(llm, history: list[dict], template: str | None) -> int:
    return len(llm.tokenize(llm.render_chat(history, template), add_special=False))


def fit_context(llm, history: list[dict], template: str | None, keep: int, room: int) -> int:
    """Drops the oldest turns after the first keep messages (the system prompt) until the prompt
    leaves room tokens for the answer, or only the newest message is left. Returns how many turns
    were dropped."""
    dropped = 0
    while _prompt_size(llm, history, template) + room > llm.n_ctx and len(history) > keep + 1:
        del history[keep]
        while len(history) > keep + 1 and history[keep]["role"] != "user":
            del history[keep]  # the answer of the dropped question goes with it
        dropped += 1
    return dropped


def _read_message(ask) -> str:
    """One message from ask (input()), its continuation lines included."""
    line = ask("> ")
    if line.lstrip().startswith('"""'):
        lines = [line.lstrip()[3:]]
        while not lines[-1].rstrip().endswith('"""'):
            lines.append(ask(". "))
        lines[-1] = lines[-1].rstrip()[:-3]
        return "\n".join(lines).strip("\n")
    lines = [line]
    while lines[-1].endswith("\\"):
        lines[-1] = lines[-1][:-1]
        lines.append(ask(". "))
    return "\n".join(lines)


def _load_conversation(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            messages = json.load(f)
    except (OSError, ValueError) as e:
        raise PyllmError(f"cannot load {path}: {e}") from None
    if not (isinstance(messages, list) and all(
            isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
            and isinstance(m.get("content"), str) for m in messages)):
        raise PyllmError(f"{path} is not a conversation: a JSON list of {{\"role\", \"content\"}} messages "
                         f"(system, user, assistant) as /save writes")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


class Session:
    """The conversation, its settings, and the commands that change them."""

    def __init__(self, args: argparse.Namespace, llm, template: str | None, sampling: dict):
        self.llm = llm
        self.template = template
        self.verbose = args.verbose
        self.system = [{"role": "system", "content": args.system}] if args.system else []
        self.history = list(self.system)
        self.sampling = dict(sampling)
        self.max_tokens = args.max_tokens

    def command(self, line: str) -> bool:
        """Runs a /command; False when it ends the session."""
        name, _, rest = line.strip().partition(" ")
        rest = rest.strip()
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/help":
            print(HELP)
        elif name == "/reset":
            self.history = list(self.system)
            print("(conversation cleared)")
        elif name == "/set":
            self._set(rest)
        elif name in ("/save", "/load") and not rest:
            print(f"({name} needs a file name: {name} FILE)")
        elif name == "/save":
            try:
                with open(rest, "w", encoding="utf-8") as f:
                    json.dump(self.history, f, ensure_ascii=False, indent=1)
            except OSError as e:
                print(f"(cannot save to {rest}: {e})")
            else:
                print(f"(saved {len(self.history)} messages to {rest})")
        elif name == "/load":
            try:
                self.history = _load_conversation(rest)
            except PyllmError as e:
                print(f"({e})")
            else:
                print(f"(loaded {len(self.history)} messages from {rest})")
        else:
            print(f"(unknown command {name}: /help lists them; start a message with // to send a /)")
        return True

    def _set(self, rest: str) -> None:
        if not rest:
            shown = {**self.sampling, "max_tokens": self.max_tokens}
            print("(" + ", ".join(f"{k} {v}" for k, v in shown.items()) + ")")
            return
        key, _, text = rest.partition(" ")
        if key not in SETTINGS or not text.strip():
            print(f"(/set NAME VALUE, NAME one of {', '.join(SETTINGS)})")
            return
        text = text.strip()
        try:
            value = None if text.lower() == "none" and key == "seed" else SETTINGS[key](text)
            if key == "max_tokens":
                if value < 1:
                    raise ValueError("max_tokens must be >= 1")
                self.max_tokens = value
            else:
                from .sampling import SamplingParams

                SamplingParams(**{**self.sampling, key: value})  # checks the value
                self.sampling[key] = value
        except ValueError as e:
            print(f"({key}: {e})")
            return
        print(f"({key} {value})")

    def send(self, message: str) -> None:
        llm = self.llm
        keep = 1 if self.history and self.history[0]["role"] == "system" else 0  # never dropped
        alone = self.history[:keep] + [{"role": "user", "content": message}]
        size = _prompt_size(llm, alone, self.template)
        if size >= llm.n_ctx:  # checked before any turn is dropped: dropping them could not help
            print(f"(that message makes a prompt of {size} tokens and the context holds {llm.n_ctx}: "
                  f"not sent; the conversation is as it was)")
            return
        self.history.append({"role": "user", "content": message})
        room = min(self.max_tokens, llm.n_ctx // 2)  # the answer's share when old turns must go
        dropped = fit_context(llm, self.history, self.template, keep, room)
        if dropped:
            print(f"(the context holds {llm.n_ctx} tokens: dropped the oldest {dropped} "
                  f"turn{'s' if dropped > 1 else ''})")
        answer = []
        stream = llm.chat(self.history, stream=True, chat_template=self.template, max_tokens=self.max_tokens,
                          **self.sampling)
        started, first = time.perf_counter(), None
        try:
            for piece in stream:
                first = first or time.perf_counter()
                answer.append(piece)
                _write(piece)
        except KeyboardInterrupt:
            _write(" [stopped]")
        if stream.finish_reason == "length":
            if stream.usage["completion_tokens"] < self.max_tokens:
                _write(" [cut: the context is full]")
            else:
                _write(" [cut: --max-tokens]")
        _write("\n")
        if self.verbose and stream.usage is not None:
            print(speed(stream.usage, started, first), file=sys.stderr, flush=True)
        self.history.append({"role": "assistant", "content": "".join(answer)})


def speed(usage: dict, started: float, first: float | None) -> str:
    """The --verbose summary of a finished generation: its sizes, the time to its first token (the
    prompt's prefill) and the rate of the tokens after it (decode)."""
    prompt, made = usage["prompt_tokens"], usage["completion_tokens"]
    line = f"pyllm: {prompt} prompt tokens, {made} generated"
    if first is not None:
        line += f"; first token after {first - started:.2f} s"
        if made > 1:
            line += f", then {(made - 1) / max(time.perf_counter() - first, 1e-9):.1f} tokens/s"
    return line


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _readline() -> None:
    """Line editing and recall for input(), and pasted text as one message where readline knows
    bracketed paste (GNU readline 8; Windows has no readline module)."""
    try:
        import readline
    except ImportError:
        return
    if "libedit" not in (readline.__doc__ or ""):
        readline.parse_and_bind("set enable-bracketed-paste on")


def run(args: argparse.Namespace, llm, sampling: dict) -> int:
    session = Session(args, llm, chat_template(args, llm), sampling)
    _readline()
    print("pyllm chat: /help lists the commands, Ctrl-C stops an answer, /exit or Ctrl-D quits.")
    while True:
        try:
            message = _read_message(input)
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        if not message.strip():
            continue
        if message.startswith("/") and not message.startswith("//"):
            if not session.command(message):
                return 0
            continue
        session.send(message[1:] if message.startswith("//") else message)
