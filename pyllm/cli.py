"""The `pyllm` command: run a prompt, chat, or describe a model.

    pyllm run [MODEL] PROMPT [--max-tokens N --temperature T --top-k K --top-p P --min-p P
                              --repetition-penalty R --seed S --stop STR ... --dtype D --verbose
                              --json-schema FILE | --grammar FILE]
    pyllm chat [MODEL]       interactive (cli_chat.py); /help lists its commands, Ctrl-C stops an
                             answer, Ctrl-D quits; --chat-template FILE for a model without one
    pyllm info [MODEL]       architecture, parameters, dtypes, context, vocabulary, chat template
    pyllm info --system      this machine: CPU features, kernels (ISA) in use, BLAS, threads, versions
    pyllm verify / inspect / perplexity   look inside a model (cli_inspect.py)
    pyllm serve [MODEL]      an OpenAI-compatible HTTP server (--host, --port, --parallel, --api-key,
                             --chat-template; needs pyllm[server]); exits with 3 when it cannot listen
    pyllm batch IN OUT --model M   OpenAI Batch requests (JSONL) through the server's engine, results to OUT;
                             run again to resume; --ray [ADDRESS] on Ray Data (batch_jobs.py, batch_ray.py)
    pyllm pull [MODEL]       fetches a model into the cache without running it; prints its path
    pyllm list               the aliases, everything else in pyllm's cache (with sizes), and the Hugging
                             Face models in the HF cache pyllm can load
    pyllm rm NAME [--yes]    removes an alias's cached file, anything else pyllm list shows in pyllm's
                             cache, or a repository from the HF cache
    pyllm --version

Only generated text goes to stdout (`pyllm run ... > out.txt` holds the answer alone); fetching
reports and errors go to stderr.
"""
from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import time
from collections import Counter

from . import cli_chat, cli_inspect, hub
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


def _port(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, got {text!r}")
    return int(text)


def _positive(text: str) -> float:
    """An argparse type: a number > 0 (seconds, MiB)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def _sampling(args: argparse.Namespace) -> dict:
    settings = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                "min_p": args.min_p, "repetition_penalty": args.repetition_penalty, "seed": args.seed}
    return {k: v for k, v in settings.items() if v is not None}


def load_model(args: argparse.Namespace, **settings):
    """The model the command names, with --file/--revision for a Hugging Face id."""
    from .loader import load

    settings.setdefault("threads", getattr(args, "threads", None))
    settings.setdefault("n_ctx", getattr(args, "n_ctx", None))
    settings.setdefault("dtype", getattr(args, "dtype", None))
    settings.setdefault("kv_dtype", getattr(args, "kv_dtype", None))
    settings.setdefault("speculative", getattr(args, "speculative", None))
    return load(args.model, file=args.file, revision=args.revision, **settings)


def _write(piece: str) -> None:
    sys.stdout.write(piece)
    sys.stdout.flush()


def _output_format(args: argparse.Namespace) -> dict:
    """--json-schema FILE / --grammar FILE (Lark or GBNF) as stream()'s keywords."""
    given = {}
    for key in ("json_schema", "grammar"):
        path = getattr(args, key)
        if path is not None:
            try:
                with open(path, encoding="utf-8") as f:
                    given[key] = f.read()
            except OSError as e:
                raise PyllmError(f"--{key.replace('_', '-')} {path}: {e.strerror}") from None
    return given


def _run(args: argparse.Namespace) -> int:
    output_format = _output_format(args)
    llm = load_model(args)
    stream = llm.stream(args.prompt, max_tokens=args.max_tokens, stop=args.stop or None, **_sampling(args),
                        **output_format)
    started, first = time.perf_counter(), None
    try:
        for piece in stream:
            first = first or time.perf_counter()
            _write(piece)
    except KeyboardInterrupt:
        _write("\n")  # end the line, so the shell's prompt starts on its own
        return 130
    _write("\n")
    if args.verbose:
        print(cli_chat.speed(stream.usage, started, first), file=sys.stderr, flush=True)
    return 0


def _chat(args: argparse.Namespace) -> int:
    return cli_chat.run(args, load_model(args), _sampling(args))


def _serve(args: argparse.Namespace) -> int:
    try:
        from . import server
    except ImportError as e:
        if e.name not in ("fastapi", "uvicorn", "sse_starlette", "starlette", "pydantic", "pydantic_core"):
            raise
        raise PyllmError(f'pyllm serve needs FastAPI, uvicorn and sse-starlette ({e.name} is not installed): '
                         f'pip install "pyllm[server]"') from None
    problem = _port_problem(args.host, args.port)  # before the model loads, and before the banner
    if problem:
        print(f"pyllm: error: cannot listen on {args.host} port {args.port}: {problem}", file=sys.stderr)
        return PORT_UNAVAILABLE
    template = cli_chat.read_template(args.chat_template) if args.chat_template else None
    llm = load_model(args, parallel=args.parallel)
    if template is not None:
        llm.render_chat([{"role": "user", "content": "Hello"}], template)  # a broken one fails here, not per request
    api_key = args.api_key if args.api_key is not None else os.environ.get("PYLLM_API_KEY") or None
    slots = f"{args.parallel} slot{'s' if args.parallel != 1 else ''}"
    speculating = f", speculative {llm.speculative.name}" if llm.speculative else ""
    print(f"pyllm serve: {llm.source} on http://{args.host}:{args.port}/v1 ({slots}, "
          f"n_ctx {llm.n_ctx}, {llm.kv_dtype} KV cache, {llm.threads} threads{speculating}"
          f"{', API key required' if api_key else ''})",
          file=sys.stderr, flush=True)
    server.serve(llm, args.model, host=args.host, port=args.port, api_key=api_key, max_queue=args.max_queue,
                 log_level=args.log_level, chat_template=template, max_body=int(args.max_body_mb * 2**20),
                 allowed_hosts=args.allowed_hosts.split(",") if args.allowed_hosts else None,
                 request_timeout=args.request_timeout, max_connections=args.max_connections,
                 shutdown_grace=args.shutdown_grace)
    return 0


PORT_UNAVAILABLE = 3  # pyllm serve's exit status when it cannot listen on --host/--port


def _port_problem(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (in use, not this machine's address, a privileged
    port), or None: tried with a bind as uvicorn's (SO_REUSEADDR), released at once."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        return f"--host {host} is not an address of this machine ({e.strerror})"
    with socket.socket(family, kind, proto) as s:
        if os.name != "nt":
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return "the port is in use (another server?): choose another with --port"
            return e.strerror or str(e)
    return None


def _pull(args: argparse.Namespace) -> int:
    from .hub import resolve

    print(resolve(args.model, file=args.file, revision=args.revision))
    return 0


def _batch(args: argparse.Namespace) -> int:
    from . import batch_jobs

    started = time.monotonic()
    if args.ray is None and (args.actors or args.cpus_per_actor):
        raise PyllmError("--actors and --cpus-per-actor go with --ray")
    if args.ray is not None and args.threads:
        raise PyllmError("with --ray an actor's threads are its CPUs: give --cpus-per-actor, not --threads")
    if args.ray is None:
        runner = batch_jobs.Runner(load_model(args, parallel=args.parallel), args.model)
        results, close = runner.run, runner.close
    else:
        from .batch_ray import ray_results

        settings = {"file": args.file, "revision": args.revision, "n_ctx": args.n_ctx, "kv_dtype": args.kv_dtype}
        results = ray_results(args.model, address=args.ray or None, actors=args.actors,
                              cpus_per_actor=args.cpus_per_actor, parallel=args.parallel,
                              **{k: v for k, v in settings.items() if v is not None})
        close = None  # the driver holds no model; Ray ends its actors with the job
    try:
        count = batch_jobs.run_file(args.input, args.output, results)
    finally:
        if close is not None:
            close()
    print(f"pyllm batch: {count} requests run in {time.monotonic() - started:.1f} s; results in {args.output}",
          file=sys.stderr)
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
    others = cache.others()
    models = cache.hf_models()
    rows = [("NAME", "WHAT", "SIZE", "CACHED", "PATH")]
    for e in entries + others + (models or []):
        rows.append((", ".join(e.names) or e.name, e.what, hub.format_size(e.size) if e.size is not None else "?",
                     "yes" if e.path else "no", e.path or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    print()
    held = sum(e.size for e in entries + others if e.path)
    print(f"pyllm's cache:        {hub.cache_dir()} (PYLLM_CACHE), {hub.format_size(held)} in all")
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


def build_parser() -> argparse.ArgumentParser:
    """The `pyllm` command's parser: one subparser per command, its func set to what runs it."""
    parser = argparse.ArgumentParser(prog="pyllm", description="Fast CPU inference of language models.")
    parser.add_argument("--version", action="version", version=f"pyllm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_arg(p, runs: bool = True):
        """MODEL and how to find it; with runs, the settings of a model that computes (not pyllm info's)."""
        p.add_argument("model", nargs="?", default=hub.DEFAULT_MODEL,
                       help=f"model folder, .gguf file, alias or Hugging Face id (default {hub.DEFAULT_MODEL})")
        p.add_argument("--file", metavar="GLOB", default=None,
                       help="with a Hugging Face id: a glob choosing the .gguf file (\"*Q4_K_M.gguf\")")
        p.add_argument("--revision", default=None, help="with a Hugging Face id: a branch, tag or commit")
        if runs:
            p.add_argument("--threads", type=_count, default=None, help="default: physical cores")
            p.add_argument("--n-ctx", type=_count, default=None,
                           help="context length to allocate (default: the model's, at most 4096)")

    def dtype_arg(p):
        p.add_argument("--dtype", default=None,
                       help="re-encode the weights at load: q8_0, q4_0, q4_1, q5_0, q4_k, bf16, f16, f32, ... "
                            "(default: as stored)")

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
    dtype_arg(run)
    constrain = run.add_mutually_exclusive_group()
    constrain.add_argument("--json-schema", metavar="FILE", help="answer JSON matching this JSON schema "
                           "(needs pyllm[structured])")
    constrain.add_argument("--grammar", metavar="FILE", help="answer text matching this Lark or GBNF grammar "
                           "(needs pyllm[structured])")
    kv_dtype_arg(run)
    run.add_argument("--verbose", "-v", action="store_true",
                     help="after the text, print the token counts and speeds on stderr")
    speculative_arg(run)
    run.set_defaults(func=_run)

    chat = sub.add_parser("chat", help="talk to a chat model")
    model_arg(chat)
    sampling_args(chat, 512)
    chat.add_argument("--system", default=None, help="a system prompt")
    chat.add_argument("--chat-template", metavar="FILE", default=None,
                      help="a Jinja chat template, for a model without one (or to replace its own)")
    dtype_arg(chat)
    kv_dtype_arg(chat)
    chat.add_argument("--verbose", "-v", action="store_true",
                      help="after each answer, print the token counts and speeds on stderr")
    speculative_arg(chat)
    chat.set_defaults(func=_chat)

    serve = sub.add_parser("serve", help="serve a model over OpenAI's HTTP API (needs pyllm[server])")
    model_arg(serve)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 for all)")
    serve.add_argument("--port", type=_port, default=8000)
    serve.add_argument("--parallel", type=_count, default=4,
                       help="sequences generated at once, each with a KV cache of n_ctx (default 4)")
    serve.add_argument("--max-queue", type=_count, default=64,
                       help="requests waiting for a slot before more are refused with 429 (default 64)")
    serve.add_argument("--api-key", default=None,
                       help="require Authorization: Bearer KEY (default: $PYLLM_API_KEY, else none)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument("--chat-template", metavar="FILE", default=None,
                       help="a Jinja chat template for /v1/chat/completions, for a model without one (or to "
                            "replace its own)")
    dtype_arg(serve)
    serve.add_argument("--max-body-mb", type=_positive, default=8,
                       help="largest request body accepted, in MiB; larger ones get 413 (default 8)")
    serve.add_argument("--allowed-hosts", default=None,
                       help="comma-separated Host names to answer ('*': any; default: localhost names when "
                            "bound to a loopback address, else any)")
    serve.add_argument("--request-timeout", type=_positive, default=30,
                       help="seconds a connection has to send a whole request; then it is closed (default 30)")
    serve.add_argument("--max-connections", type=_count, default=256,
                       help="connections and requests at once; more are answered 503 (default 256)")
    serve.add_argument("--shutdown-grace", type=_positive, default=10,
                       help="seconds requests in flight may run on after SIGTERM/Ctrl-C before they are "
                            "answered 503 (default 10)")
    kv_dtype_arg(serve)
    speculative_arg(serve)
    serve.set_defaults(func=_serve)

    batch = sub.add_parser("batch", help="run a file of OpenAI Batch requests (JSONL), here or on Ray "
                                         "(needs pyllm[server], and pyllm[ray] for --ray)")
    batch.add_argument("input", metavar="IN", help="requests, one a line: custom_id, method, url, body")
    batch.add_argument("output", metavar="OUT", help="results, one a line, in the order they finish; run again "
                                                     "with the same files to run only what OUT lacks")
    batch.add_argument("--model", default=hub.DEFAULT_MODEL,
                       help=f"model folder, .gguf file, alias or Hugging Face id (default {hub.DEFAULT_MODEL})")
    batch.add_argument("--file", default=None, help="with a Hugging Face id: a glob choosing the .gguf file")
    batch.add_argument("--revision", default=None, help="with a Hugging Face id: a branch, tag or commit")
    batch.add_argument("--threads", type=_count, default=None, help="default: physical cores (not with --ray: "
                                                                    "an actor's threads are its CPUs)")
    batch.add_argument("--n-ctx", type=_count, default=None,
                       help="context length to allocate (default: the model's, at most 4096)")
    batch.add_argument("--parallel", type=_count, default=4,
                       help="requests generated at once (by each Ray actor), each with a KV cache (default 4)")
    batch.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                       help="run on Ray Data: on the cluster at ADDRESS, else on the one ray.init() finds or starts")
    batch.add_argument("--actors", type=_count, default=None,
                       help="with --ray: models loaded at once (default: as many as the CPUs hold)")
    batch.add_argument("--cpus-per-actor", type=_count, default=None,
                       help="with --ray: each actor's CPUs, its threads (default: the cluster's CPUs / --actors, "
                            "else up to 8)")
    kv_dtype_arg(batch)
    batch.set_defaults(func=_batch)

    info = sub.add_parser("info", help="describe a model")
    model_arg(info, runs=False)
    info.add_argument("--system", action="store_true",
                      help="describe this machine and the kernels pyllm picked instead (MODEL is not loaded)")
    info.set_defaults(func=_info)

    cli_inspect.add_commands(sub, model_arg, load_model)  # verify, inspect, perplexity

    pull = sub.add_parser("pull", help="fetch a model into the cache without running it; prints its path")
    model_arg(pull, runs=False)
    pull.set_defaults(func=_pull)

    listing = sub.add_parser("list", help="the aliases, and the Hugging Face models in the HF cache pyllm can load")
    listing.set_defaults(func=_list)

    rm = sub.add_parser("rm", help="remove a cached model: an alias's file, anything else in pyllm's cache, or a "
                                   "repository from the HF cache")
    rm.add_argument("model", help="an alias (smollm2), a name pyllm list shows in pyllm's cache, or a Hugging Face "
                                  "id (owner/name)")
    rm.add_argument("--yes", "-y", action="store_true", help="remove without asking (needed off a terminal)")
    rm.set_defaults(func=_rm)

    parser.commands = sub.choices  # name -> its subparser, for parse()
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's arguments. argparse takes a subcommand's positionals only from their
    first run between options ("pyllm run MODEL --max-tokens 5 PROMPT" was refused), so the
    subcommand's own parser takes them intermixed with its options."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in parser.commands:
        args = parser.commands[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
        return args
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
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
