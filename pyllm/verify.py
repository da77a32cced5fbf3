"""pyllm verify: pyllm against transformers on the same token ids, component by component.

The ladder lists, in the order the forward computes them, every traced point of every layer with
its max abs difference, relative error (‖pyllm - ref‖ / ‖ref‖), cosine similarity and, for the
logits, argmax agreement, and names the first point whose relative error passes the tolerance:
where the two first part, which is where to look.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import numpy as np

from .binding import int8_activations
from .trace import CAPTURES, LAYER_CAPTURES

DEFAULT_PROMPT = "The capital of France is Paris, and the capital of Germany is Berlin. The sky is blue because"
# Relative error allowed where pyllm multiplies float32 activations (float weights): both sides
# compute the same thing in a different order.
FLOAT_TOLERANCE = 1e-3
# Quantized weights multiply 8-bit activations at every prompt length (prefill as decode), which
# transformers never does: a correct engine differs by up to ~10% in the smaller
# block outputs (attn_out, mlp_out) and ~3% in the residual stream (SmolLM2 Q4_1, 4 tokens).
INT8_TOLERANCE = 0.2


@dataclass
class Rung:
    component: str
    layer: int | None          # None for embed, final_norm, logits
    max_abs: float
    rel_err: float
    cosine: float
    argmax_agreement: float | None = None  # logits only
    passed: bool = True

    @property
    def name(self) -> str:
        return self.component if self.layer is None else f"layer {self.layer} {self.component}"


@dataclass
class Ladder:
    source: str
    reference: str
    n_tokens: int
    tolerance: float
    activations: str           # "float32" | "int8": how pyllm's matmuls ran for this prompt
    rungs: list[Rung] = field(default_factory=list)

    @property
    def first_failure(self) -> Rung | None:
        return next((r for r in self.rungs if not r.passed), None)

    @property
    def ok(self) -> bool:
        return self.first_failure is None

    def to_json(self) -> str:
        first = self.first_failure
        return json.dumps({"source": self.source, "reference": self.reference, "n_tokens": self.n_tokens,
                           "tolerance": self.tolerance, "activations": self.activations, "ok": self.ok,
                           "first_failure": first.name if first else None,
                           "rungs": [asdict(r) for r in self.rungs]}, indent=1)

    def to_text(self) -> str:
        lines = [f"pyllm {self.source}", f"  vs transformers {self.reference}",
                 f"  {self.n_tokens} tokens, {self.activations} activations, tolerance {self.tolerance:g} "
                 f"(relative error)", "",
                 f"{'component':<24}{'max abs':>11}{'rel err':>11}{'cosine':>12}{'argmax':>9}"]
        for r in self.rungs:
            argmax = f"{r.argmax_agreement:8.1%}" if r.argmax_agreement is not None else ""
            mark = "" if r.passed else "   <-- exceeds"
            lines.append(f"{r.name:<24}{r.max_abs:11.3e}{r.rel_err:11.3e}{r.cosine:12.8f}{argmax:>9}{mark}")
        first = self.first_failure
        lines.append("")
        lines.append(f"first divergence: {first.name} (relative error {first.rel_err:.3g} > {self.tolerance:g})"
                     if first else "every component agrees within the tolerance")
        return "\n".join(lines)


def compare(component: str, layer: int | None, ours: np.ndarray, ref: np.ndarray, tolerance: float) -> Rung:
    a, b = ours.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    if a.shape != b.shape:
        raise ValueError(f"{component}: pyllm's shape {ours.shape} differs from the reference's {ref.shape}")
    diff = a - b
    norm_a, norm_b = np.linalg.norm(a), np.linalg.norm(b)
    rel = float(np.linalg.norm(diff) / norm_b) if norm_b else float(np.linalg.norm(diff))
    cosine = float(a @ b / (norm_a * norm_b)) if norm_a and norm_b else float(norm_a == norm_b)
    agreement = None
    if component == "logits":
        agreement = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    finite = np.isfinite(a).all()
    return Rung(component, layer, float(np.abs(diff).max()) if finite else float("inf"), rel if finite else
                float("inf"), cosine, agreement, passed=bool(finite and rel <= tolerance))


def activations_used(llm) -> str:
    """Whether pyllm's matmuls multiply float32 or 8-bit activations: with any quantized matrix,
    8-bit ones at every prompt length, so that prefill computes what decode does."""
    return "int8" if int8_activations(llm.core) else "float32"


def ladder(llm, reference_model, ids: list[int], layers: list[int], tolerance: float | None = None,
           reference_name: str = "") -> Ladder:
    """Runs both on ids and compares every capture of the given layers."""
    from .oracle import reference_trace
    from .trace import run_trace

    activations = activations_used(llm)
    if tolerance is None:
        tolerance = FLOAT_TOLERANCE if activations == "float32" else INT8_TOLERANCE
    _, ours = run_trace(llm.core, llm.spec, ids, layers, CAPTURES)
    ref = reference_trace(reference_model, ids, layers, CAPTURES)
    out = Ladder(llm.source, reference_name, len(ids), tolerance, activations)
    out.rungs.append(compare("embed", None, ours["embed"], ref["embed"], tolerance))
    for i, layer in enumerate(layers):
        for name in LAYER_CAPTURES:
            out.rungs.append(compare(name, layer, ours[name][i], ref[name][i], tolerance))
    for name in ("final_norm", "logits"):
        out.rungs.append(compare(name, None, ours[name], ref[name], tolerance))
    return out


def verify(source, prompt: str | list[int] = DEFAULT_PROMPT, *, layers=None, tolerance: float | None = None,
           threads: int | None = None, **load_options) -> Ladder:
    """Loads source in pyllm and in transformers (a .gguf through transformers' GGUF loader) and
    returns the ladder for prompt. load_options (file=, revision=) go to pyllm.load.

    >>> print(pyllm.verify.verify("path/to/model").to_text())  # doctest: +SKIP
    """
    from .loader import load
    from .oracle import load_reference
    from .trace import check_layers

    llm = load(source, threads=threads, **load_options)
    ids = llm.prompt_ids(prompt)
    layers = check_layers(layers, llm.spec.n_layers)
    reference = load_reference(llm.source)
    return ladder(llm, reference, ids, layers, tolerance, reference_name=llm.source)
