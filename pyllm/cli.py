"""The `pyllm` command: run a prompt, chat, or describe a model.

    pyllm run [MODEL] PROMPT [--max-tokens N --temperature T --top-k K --top-p P --min-p P
                              --seed S --stop STR ...]
    pyllm chat [MODEL]       interactive; /reset clears the history, Ctrl-C stops an answer,
                             Ctrl-D quits; --chat-template FILE for a model without one
    pyllm info [MODEL]       architecture, parameters, dtypes, context, vocabulary, chat template
    pyllm info --system      this machine: CPU features, kernels (ISA) in use, BLAS, threads, versions
    pyllm verify / inspect / perplexity   look inside a model (cli_inspect.py)
    pyllm serve [MODEL]      an OpenAI-compatible HTTP server (--host, --port, --parallel, --api-key;
                             needs pyllm[server])
    pyllm list               the aliases, and the Hugging Face models in the HF cache pyllm can load
    pyllm rm MODEL [--yes]   removes an alias's cached file, or a repository from the HF cache
    pyllm --version

Only generated text goes to stdout (`pyllm run ... > out.txt` holds the answer alone); fetching
reports and errors go to stderr.
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

from . import cli_inspect, hub
from .errors import PyllmError
from .version import __version__


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


def load_model(args: argparse.Namespace, **settings):
    """The model the command names, with --file/--revision for a Hugging Face id."""
    from .loader import load

    settings.setdefault("threads", args.threads)
    settings.setdefault("n_ctx", getattr(args, "n_ctx", None))
    settings.setdefault("kv_dtype", getattr(args, "kv_dtype", None))
    settings.setdefault("speculative", getattr(args, "speculative", None))
    return load(args.model, file=args.file, revision=args.revision, **settings)


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _run(args: argparse.Namespace) -> int:
    llm = load_model(args)
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
    llm = load_model(args)
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


def _serve(args: argparse.Namespace) -> int:
    try:
        from . import server
    except ImportError as e:
        if e.name not in ("fastapi", "uvicorn", "sse_starlette", "starlette", "pydantic", "pydantic_core"):
            raise
        raise PyllmError(f'pyllm serve needs FastAPI, uvicorn and sse-starlette ({e.name} is not installed): '
                         f'pip install "pyllm[server]"') from None
    llm = load_model(args, parallel=args.parallel)
    api_key = args.api_key if args.api_key is not None else os.environ.get("PYLLM_API_KEY") or None
    print(f"pyllm serve: {llm.source} on http://{args.host}:{args.port}/v1 ({args.parallel} slots, "
          f"n_ctx {llm.n_ctx}, {llm.kv_dtype} KV cache, {llm.threads} threads"
          f"{f', speculative {llm.speculative.name}' if llm.speculative else ''}{', API key required' if api_key else ''})",
          file=sys.stderr, flush=True)
    server.serve(llm, args.model, host=args.host, port=args.port, api_key=api_key, max_queue=args.max_queue,
                 log_level=args.log_level)
    return 0


def _info(args: argparse.Namespace) -> int:
    if args.system:
        from .system import system_lines

        print("\n".join(system_lines()))
        return 0
    llm = load_model(args, threads=1, n_ctx=16)
    spec = llm.spec
    print(f"source:          {llm.source}")
    print(f"architecture:    {spec.family} ({spec.n_layers} layers, dim {spec.dim}, {spec.n_heads} heads, "
          f"{spec.n_kv_heads} KV heads, head_dim {spec.head_dim}, FFN {spec.ffn_dim})")
    for line in spec.describe(llm.core.slot_names):
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


def _list(args: argparse.Namespace) -> int:
    from . import cache

    entries = cache.aliases()
    models = cache.hf_models()
    rows = [("NAME", "WHAT", "SIZE", "CACHED", "PATH")]
    for e in entries + (models or []):
        rows.append((", ".join(e.names) or e.name, e.what, hub.format_size(e.size) if e.size is not None else "?",
                     "yes" if e.path else "no", e.path or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    print()
    print(f"pyllm's cache:        {hub.cache_dir()} (PYLLM_CACHE)")
    if models is None:
        print('Hugging Face cache:   not listed: huggingface_hub is not installed (pip install "pyllm[hub]")')
    else:
        print(f"Hugging Face cache:   {cache.hf_cache_folder()} (HF_HUB_CACHE or HF_HOME)")
    return 0


def _rm(args: argparse.Namespace) -> int:
    from . import cache

    entry = cache.find(args.model)
    what = f"{entry.name} ({entry.what}, {hub.format_size(entry.size or 0)}) at {entry.path}"
    if not args.yes:
        if not sys.stdin.isatty():
            raise PyllmError(f"removing {what} needs --yes when stdin is not a terminal")
        try:
            answer = input(f"remove {what}? [y/N] ")
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 1
    freed = cache.remove(entry)
    print(f"removed {entry.name} ({hub.format_size(freed)} freed)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyllm", description="Fast CPU inference of language models.")
    parser.add_argument("--version", action="version", version=f"pyllm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_arg(p):
        p.add_argument("model", nargs="?", default=hub.DEFAULT_MODEL,
                       help=f"model folder, .gguf file, alias or Hugging Face id (default {hub.DEFAULT_MODEL})")
        p.add_argument("--file", default=None,
                       help="with a Hugging Face id: a glob choosing the .gguf file (\"*Q4_K_M.gguf\")")
        p.add_argument("--revision", default=None, help="with a Hugging Face id: a branch, tag or commit")
        p.add_argument("--threads", type=_count, default=None, help="default: physical cores")
        p.add_argument("--n-ctx", type=_count, default=None,
                       help="context length to allocate (default: the model's, at most 4096)")

    def kv_dtype_arg(p):
        p.add_argument("--kv-dtype", choices=["f32", "f16", "q8_0"], default=None,
                       help="the KV cache's element type: f16 halves its memory and bandwidth (long contexts), "
                            "q8_0 about quarters it (default: f16 for quantized weights, f32 for float ones)")

    def speculative_arg(p):
        p.add_argument("--speculative", metavar="lookup|draft:FILE|self:N", default=None,
                       help="speculative decoding, the same output: lookup (n-grams of the prompt: editing, "
                            "summaries), draft:FILE (a smaller model with the same tokenizer), self:N (the "
                            "model's first N layers)")

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
    kv_dtype_arg(run)
    speculative_arg(run)
    run.set_defaults(func=_run)

    chat = sub.add_parser("chat", help="talk to a chat model")
    model_arg(chat)
    sampling_args(chat, 512)
    chat.add_argument("--system", default=None, help="a system prompt")
    chat.add_argument("--chat-template", metavar="FILE", default=None,
                      help="a Jinja chat template, for a model without one (or to replace its own)")
    kv_dtype_arg(chat)
    speculative_arg(chat)
    chat.set_defaults(func=_chat)

    serve = sub.add_parser("serve", help="serve a model over OpenAI's HTTP API (needs pyllm[server])")
    model_arg(serve)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for all)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--parallel", type=_count, default=4,
                       help="sequences generated at once, each with a KV cache of n_ctx (default 4)")
    serve.add_argument("--max-queue", type=_count, default=64,
                       help="requests waiting for a slot before more are refused with 429 (default 64)")
    serve.add_argument("--api-key", default=None,
                       help="require Authorization: Bearer KEY (default: $PYLLM_API_KEY, else none)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    kv_dtype_arg(serve)
    speculative_arg(serve)
    serve.set_defaults(func=_serve)

    info = sub.add_parser("info", help="describe a model")
    model_arg(info)
    info.add_argument("--system", action="store_true",
                      help="describe this machine and the kernels pyllm picked instead (MODEL is not loaded)")
    info.set_defaults(func=_info)

    cli_inspect.add_commands(sub, model_arg, load_model)  # verify, inspect, perplexity

    listing = sub.add_parser("list", help="the aliases, and the Hugging Face models in the HF cache pyllm can load")
    listing.set_defaults(func=_list)

    rm = sub.add_parser("rm", help="remove a cached model: an alias's file, or a repository from the HF cache")
    rm.add_argument("model", help="an alias (smollm2) or a Hugging Face id (owner/name)")
    rm.add_argument("--yes", "-y", action="store_true", help="remove without asking (needed off a terminal)")
    rm.set_defaults(func=_rm)

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
