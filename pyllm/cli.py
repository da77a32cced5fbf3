"""The `pyllm` command: run a prompt, chat, or describe a model.

    pyllm run [MODEL] PROMPT [--max-tokens N --temperature T --top-k K --top-p P --min-p P
                              --seed S --stop STR ...]
    pyllm chat [MODEL]       interactive; /reset clears the history, Ctrl-C stops an answer,
                             Ctrl-D quits; --chat-template FILE for a model without one
    pyllm info [MODEL]       architecture, parameters, dtypes, context, vocabulary, chat template
    pyllm --version

Only generated text goes to stdout (`pyllm run ... > out.txt` holds the answer alone); fetching
reports and errors go to stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

from . import __version__, hub
from .errors import PyllmError


def _count(text: str) -> int:
    """An argparse type: an int >= 1 (0 threads, an empty context or 0 new tokens is a mistake)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _sampling(args: argparse.Namespace) -> dict:
    settings = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                "min_p": args.min_p, "repetition_penalty": args.repetition_penalty, "seed": args.seed}
    return {k: v for k, v in settings.items() if v is not None}


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _run(args: argparse.Namespace) -> int:
    from .model import load

    llm = load(args.model, threads=args.threads, n_ctx=args.n_ctx)
    try:
        for piece in llm.stream(args.prompt, max_tokens=args.max_tokens, stop=args.stop or None,
                                **_sampling(args)):
            _write(piece)
    except KeyboardInterrupt:
        _write("\n")  # end the line, so the shell's prompt starts on its own
        return 130
    _write("\n")
    return 0


def _chat_template(args: argparse.Namespace, llm) -> str | None:
    """The template to chat with (--chat-template FILE, else the model's own), tried on a first
    message so that a missing or broken one is reported before the user types anything."""
    template = None
    if args.chat_template:
        try:
            with open(args.chat_template, encoding="utf-8") as f:
                template = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise PyllmError(f"cannot read --chat-template {args.chat_template}: {e}") from None
    elif not llm.tokenizer.chat_template:
        raise PyllmError(f"{llm.source} has no chat template: give one with --chat-template FILE "
                         f"(a Jinja file, such as a Hugging Face model's chat_template.jinja)")
    first = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": "Hello"}]
    llm.render_chat(first, template)
    return template


def _fit_context(llm, history: list[dict], template: str | None, keep: int, room: int) -> tuple[int, int]:
    """Drops the oldest turns after the first keep messages (the system prompt) until the prompt
    leaves room tokens for the answer, or only the newest message is left. Returns how many turns
    were dropped and the prompt's length in tokens."""
    dropped = 0
    while True:
        size = len(llm.tokenize(llm.render_chat(history, template), add_special=False))
        if size + room <= llm.n_ctx or len(history) <= keep + 1:
            return dropped, size
        del history[keep]
        while len(history) > keep + 1 and history[keep]["role"] != "user":
            del history[keep]  # the answer of the dropped question goes with it
        dropped += 1


def _chat(args: argparse.Namespace) -> int:
    from .model import load

    llm = load(args.model, threads=args.threads, n_ctx=args.n_ctx)
    template = _chat_template(args, llm)
    try:
        import readline  # noqa: F401  (input() then edits the line and recalls earlier ones)
    except ImportError:  # Windows has none
        pass
    history: list[dict] = []
    if args.system:
        history.append({"role": "system", "content": args.system})
    keep = len(history)
    room = min(args.max_tokens, llm.n_ctx // 2)  # the answer's share when old turns must go
    print("pyllm chat: /reset clears the conversation, Ctrl-C stops an answer, Ctrl-D quits.")
    while True:
        try:
            line = input("> ")
        except EOFError:
            print()
            return 0
        except KeyboardInterrupt:
            print()
            continue
        if not line.strip():
            continue
        if line.strip() == "/reset":
            history = history[:1] if args.system else []
            print("(conversation cleared)")
            continue
        history.append({"role": "user", "content": line})
        dropped, size = _fit_context(llm, history, template, keep, room)
        if dropped:
            print(f"(the context holds {llm.n_ctx} tokens: dropped the oldest {dropped} "
                  f"turn{'s' if dropped > 1 else ''})")
        if size >= llm.n_ctx:
            print(f"(that message makes a prompt of {size} tokens and the context holds "
                  f"{llm.n_ctx}: not sent)")
            history.pop()
            continue
        answer = []
        stream = llm.chat(history, stream=True, chat_template=template, max_tokens=args.max_tokens,
                          **_sampling(args))
        try:
            for piece in stream:
                answer.append(piece)
                _write(piece)
        except KeyboardInterrupt:
            _write(" [stopped]")
        if stream.finish_reason == "length":
            if stream.usage["completion_tokens"] < args.max_tokens:
                _write(" [cut: the context is full]")
            else:
                _write(" [cut: --max-tokens]")
        _write("\n")
        history.append({"role": "assistant", "content": "".join(answer)})


def _info(args: argparse.Namespace) -> int:
    from .model import load

    llm = load(args.model, threads=1, n_ctx=16)
    spec = llm.spec
    print(f"source:          {llm.source}")
    print(f"architecture:    {spec.family} ({spec.n_layers} layers, dim {spec.dim}, {spec.n_heads} heads, "
          f"{spec.n_kv_heads} KV heads, head_dim {spec.head_dim}, FFN {spec.ffn_dim})")
    for line in spec.describe(llm._core.slot_names):
        print(line)
    params, per_type = 0, Counter()
    for info in llm.weights.values():
        n = 1
        for d in info.shape:
            n *= d
        params += n
        per_type[info.wtype.name] += info.nbytes
    print(f"parameters:      {params:,}")
    print("weights:         " + ", ".join(f"{t} {b / 1e6:.1f} MB" for t, b in per_type.most_common()))
    print(f"context length:  {spec.max_seq_len}")
    print(f"vocabulary:      {spec.vocab_size}")
    print(f"chat template:   {'yes' if llm.tokenizer.chat_template else 'no'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyllm", description="Fast CPU inference of language models.")
    parser.add_argument("--version", action="version", version=f"pyllm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_arg(p):
        p.add_argument("model", nargs="?", default=hub.DEFAULT_MODEL,
                       help=f"model folder, .gguf file or alias (default {hub.DEFAULT_MODEL})")
        p.add_argument("--threads", type=_count, default=None, help="default: physical cores")
        p.add_argument("--n-ctx", type=_count, default=None,
                       help="context length to allocate (default: the model's, at most 4096)")

    def sampling_args(p, max_tokens):
        p.add_argument("--max-tokens", type=_count, default=max_tokens)
        p.add_argument("--temperature", type=float, default=None, help="0 = greedy (default)")
        p.add_argument("--top-k", type=int, default=None)
        p.add_argument("--top-p", type=float, default=None)
        p.add_argument("--min-p", type=float, default=None)
        p.add_argument("--repetition-penalty", type=float, default=None)
        p.add_argument("--seed", type=int, default=None)

    run = sub.add_parser("run", help="continue a prompt, printing tokens as they arrive")
    model_arg(run)
    run.add_argument("prompt", help="the text to continue")
    sampling_args(run, 128)
    run.add_argument("--stop", action="append", help="stop before this text (repeatable)")
    run.set_defaults(func=_run)

    chat = sub.add_parser("chat", help="talk to a chat model")
    model_arg(chat)
    sampling_args(chat, 512)
    chat.add_argument("--system", default=None, help="a system prompt")
    chat.add_argument("--chat-template", metavar="FILE", default=None,
                      help="a Jinja chat template, for a model without one (or to replace its own)")
    chat.set_defaults(func=_chat)

    info = sub.add_parser("info", help="describe a model")
    model_arg(info)
    info.set_defaults(func=_info)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (PyllmError, ValueError) as e:
        print(f"pyllm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`pyllm info | head`): stop quietly, as other command-line tools do.
        # stdout points at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
