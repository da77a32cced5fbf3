"""The `pyllm` command: run a prompt (streamed as tokens arrive) or describe a model."""
from __future__ import annotations

import argparse
import sys

from . import hub
from .errors import PyllmError


def _run(args: argparse.Namespace) -> int:
    from .model import load

    llm = load(args.model, threads=args.threads, n_ctx=args.n_ctx)
    for piece in llm.stream(args.prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                            seed=args.seed):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyllm", description="Fast CPU inference of language models.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="continue a prompt, printing tokens as they arrive")
    run.add_argument("model", nargs="?", default=hub.DEFAULT_MODEL,
                     help=f"model folder, .gguf file or alias (default {hub.DEFAULT_MODEL})")
    run.add_argument("prompt", help="the text to continue")
    run.add_argument("--max-tokens", type=int, default=128)
    run.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--threads", type=int, default=None, help="default: physical cores")
    run.add_argument("--n-ctx", type=int, default=None, help="context length to allocate")
    run.set_defaults(func=_run)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (PyllmError, ValueError) as e:
        print(f"pyllm: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
