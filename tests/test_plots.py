"""pyllm inspect's pictures: PNGs that hold what they say (the expected panels, not blank), from
Python and from the command line."""
from __future__ import annotations

import numpy as np
import pytest

import pyllm
from pyllm import cli, plots

PROMPT = "The capital of France is Paris, and"


@pytest.fixture(scope="module")
def model(family_checkpoint):
    folder = family_checkpoint("gemma2")
    return folder, pyllm.load(folder, threads=2)


def _png(path) -> np.ndarray:
    from matplotlib.image import imread

    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    image = imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert image[..., :3].std() > 0.05  # not blank: cells, labels, a colour bar
    return image


def _heatmaps(fig) -> int:
    return sum(1 for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>")


def test_attention_panels_per_layer_and_head(model, tmp_path):
    _, llm = model
    fig = plots.attention(llm, PROMPT, layers=[0, 2], heads=[1, 3])
    assert _heatmaps(fig) == 4
    titles = sorted(ax.get_title() for ax in fig.axes if ax.get_title())
    assert titles == ["layer 0 head 1", "layer 0 head 3", "layer 2 head 1", "layer 2 head 3"]
    n = len(llm.tokenize(PROMPT))
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(labels) == n and labels[0] == "<bos>" and "·c" in labels  # spaces shown as ·
    plots.save(fig, tmp_path / "attention.png")
    _png(tmp_path / "attention.png")


@pytest.fixture(scope="module")
def many_heads(tmp_path_factory):
    """A tiny Llama with 18 heads a layer, as the issue's model had."""
    from conftest import make_tiny_checkpoint

    folder = make_tiny_checkpoint(str(tmp_path_factory.mktemp("heads")), hidden_size=144, num_attention_heads=18,
                                  num_key_value_heads=6, num_hidden_layers=2)
    return pyllm.load(folder, threads=2)


def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _overlaps(boxes) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


def test_many_heads_make_a_grid_with_readable_labels_and_titles_apart(many_heads):
    fig = plots.attention(many_heads, PROMPT, layers=[0])  # 18 heads
    panels = [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]
    assert len(panels) == 18
    columns = {round(ax.get_position().x0, 3) for ax in panels}
    rows = {round(ax.get_position().y0, 3) for ax in panels}
    assert len(columns) == plots.MAX_COLUMNS and len(rows) == 3  # 3 rows of 6 heads, not a strip of 18
    width, height = fig.get_size_inches()
    assert 0.4 <= height / width <= 2 and width <= 24
    renderer = _renderer(fig)
    titles = [ax.title.get_window_extent(renderer) for ax in panels]
    assert _overlaps(titles) == []
    for ax in panels:
        keys = [t for t in ax.get_xticklabels() if t.get_text()]
        assert len(keys) == len(many_heads.tokenize(PROMPT)) and all(t.get_fontsize() >= 6 for t in keys)
        assert _overlaps([t.get_window_extent(renderer) for t in keys]) == []


def test_a_long_prompt_labels_every_few_tokens_without_overlap(model):
    _, llm = model
    text = "The capital of France is Paris, and the capital of Germany is Berlin. " * 5
    fig = plots.attention(llm, text, layers=[0], heads=[0])
    renderer = _renderer(fig)
    ax = next(a for a in fig.axes if a.images)
    keys = [t for t in ax.get_xticklabels() if t.get_text()]
    assert len(llm.tokenize(text)) > plots.MAX_TICKS >= len(keys) > plots.MAX_TICKS // 2
    assert _overlaps([t.get_window_extent(renderer) for t in keys]) == []


def test_logit_lens_grid(model, tmp_path):
    _, llm = model
    fig = plots.logit_lens(llm, PROMPT)
    ax = next(a for a in fig.axes if a.images)
    grid = ax.images[0].get_array()
    n = len(llm.tokenize(PROMPT))
    assert grid.shape == (llm.spec.n_layers, n)
    assert len(ax.texts) == grid.size  # a token written in every cell
    # the last layer's row is the model's own prediction
    last = llm.logits(llm.tokenize(PROMPT)).astype(np.float64)
    p = np.exp(last - last.max(-1, keepdims=True))
    np.testing.assert_allclose(grid[-1], (p / p.sum(-1, keepdims=True)).max(-1), atol=1e-5)
    plots.save(fig, tmp_path / "lens.png")
    _png(tmp_path / "lens.png")


def test_entropy_and_surprisal(model, tmp_path):
    _, llm = model
    fig = plots.entropy(llm, PROMPT)
    top, bottom = fig.axes
    score = llm.score(PROMPT, top=0)
    heights = [bar.get_height() for bar in top.patches]
    np.testing.assert_allclose(heights, score.surprisal, rtol=1e-6)
    assert len(bottom.lines[0].get_xdata()) == score.n_scored
    plots.save(fig, tmp_path / "entropy.png")
    _png(tmp_path / "entropy.png")


@pytest.mark.parametrize("kind", ["attention", "logit-lens", "entropy"])
def test_command_line_writes_the_png(model, tmp_path, kind, capsys):
    folder, _ = model
    out = tmp_path / f"{kind}.png"
    assert cli.main(["inspect", folder, PROMPT, "--plot", kind, "--out", str(out), "--threads", "2"]) == 0
    _png(out)
    assert cli.main(["inspect", folder, PROMPT, "--plot", kind, "--out", "/nonexistent/dir/x.png"]) == 1
    assert "cannot write" in capsys.readouterr().err


def test_too_many_panels_or_a_bad_head_is_refused(model):
    _, llm = model
    with pytest.raises(ValueError, match="heads"):
        plots.attention(llm, PROMPT, heads=[llm.spec.n_heads])
