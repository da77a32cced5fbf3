"""The `pyllm` commands that look inside a model:

    pyllm verify [MODEL] [PROMPT] [--layers 0,1,-1] [--tol T] [--json]
                           the component ladder against transformers; exit 1 at a divergence
    pyllm inspect [MODEL] PROMPT --plot attention|logit-lens|entropy --out FILE.png
                           [--layers ...] [--heads ...]
    pyllm perplexity [MODEL] TEXT_FILE [--window N] [--stride N] [--json]
                           perplexity of a text file, in sliding windows past the context
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable


def _int_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated ints, got {text!r}") from None


def _verify(args: argparse.Namespace) -> int:
    from .verify import DEFAULT_PROMPT, verify

    result = verify(args.model, args.prompt or DEFAULT_PROMPT, layers=args.layers, tolerance=args.tol,
                    threads=args.threads, file=args.file, revision=args.revision)
    print(result.to_json() if args.json else result.to_text())
    return 0 if result.ok else 1


def _inspect(load_model: Callable, args: argparse.Namespace) -> int:
    from . import plots

    llm = load_model(args)
    if args.plot == "attention":
        fig = plots.attention(llm, args.prompt, layers=args.layers, heads=args.heads)
    elif args.plot == "logit-lens":
        fig = plots.logit_lens(llm, args.prompt, layers=args.layers)
    else:
        fig = plots.entropy(llm, args.prompt)
    plots.save(fig, args.out)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _perplexity(load_model: Callable, args: argparse.Namespace) -> int:
    from .errors import PyllmError

    try:
        with open(args.text_file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise PyllmError(f"cannot read {args.text_file}: {e}") from None
    llm = load_model(args)
    ids = llm.tokenize(text)
    bar = _progress(len(ids) - 1, quiet=args.json)
    try:
        score = llm.score(ids, top=0, window=args.window, stride=args.stride, progress=bar.update)
    finally:
        bar.close()
    result = {"file": args.text_file, "tokens": len(ids), "scored": score.n_scored, "perplexity": score.perplexity,
              "mean_nll": float(-score.logprobs.mean())}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.text_file}: {score.n_scored} tokens scored, perplexity {score.perplexity:.4f} "
              f"(mean NLL {result['mean_nll']:.4f} nats)")
    return 0


def _progress(total: int, quiet: bool):
    """A progress bar on stderr when it is a terminal (tqdm), silent otherwise."""
    from tqdm import tqdm

    return tqdm(total=total, unit="tok", desc="scoring", disable=quiet or not sys.stderr.isatty(),
                file=sys.stderr)


def add_commands(sub, model_arg: Callable, load_model: Callable) -> None:
    """Adds verify, inspect and perplexity to the pyllm command's subparsers; model_arg(parser) adds
    the model's arguments, load_model(args) loads what they name (both cli.py's)."""
    verify = sub.add_parser("verify", help="compare pyllm with transformers, component by component")
    model_arg(verify)
    verify.add_argument("prompt", nargs="?", default=None, help="the text to run (default: a fixed sentence)")
    verify.add_argument("--layers", type=_int_list, default=None, help="layers to compare (default: all)")
    verify.add_argument("--tol", type=float, default=None,
                        help="relative error allowed (default 1e-3 with float32 activations, 0.2 with 8-bit)")
    verify.add_argument("--json", action="store_true", help="print the ladder as JSON")
    verify.set_defaults(func=_verify)

    inspect = sub.add_parser("inspect", help="draw attention, the logit lens or per-token entropy")
    model_arg(inspect)
    inspect.add_argument("prompt", help="the text to look at")
    inspect.add_argument("--plot", choices=("attention", "logit-lens", "entropy"), required=True)
    inspect.add_argument("--out", required=True, metavar="FILE.png")
    inspect.add_argument("--layers", type=_int_list, default=None,
                         help="layers to draw (default: attention the first and last, logit lens all)")
    inspect.add_argument("--heads", type=_int_list, default=None, help="attention heads to draw (default all)")
    inspect.set_defaults(func=functools.partial(_inspect, load_model))

    ppl = sub.add_parser("perplexity", help="perplexity of a text file")
    model_arg(ppl)
    ppl.add_argument("text_file", metavar="TEXT_FILE", help="a UTF-8 text file to score")
    ppl.add_argument("--window", type=int, default=None, help="tokens per window (default: the context)")
    ppl.add_argument("--stride", type=int, default=None, help="tokens a window advances (default window/2)")
    ppl.add_argument("--json", action="store_true")
    ppl.set_defaults(func=functools.partial(_perplexity, load_model))
