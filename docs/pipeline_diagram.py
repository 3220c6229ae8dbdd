"""The home page's pipeline picture: the recipe's stages as boxes and arrows, drawn to SVG by the
site's build (docs/hooks.py) from the data below, offline (matplotlib; no fonts or scripts fetched).

Why a picture drawn from data: ASCII art scrolled sideways on the site and could not be read on a
phone; an SVG scales to the page, and a stage renamed here is renamed in the picture at the next build.

    python docs/pipeline_diagram.py OUT.svg       # the same SVG the build writes
"""
from __future__ import annotations

import io
import sys

# (key, label, x, y): box centres on a 14 x 6 grid. Rows: choose the pool (left to right), train,
# evaluate (right to left, under the trainer that makes the checkpoint).
BOXES = [
    ("packs", "task packs", 1.3, 5.0),
    ("probe", "probe\nSlurm array: tasks × n", 4.1, 5.0),
    ("db1", "results.duckdb\nshards merged", 6.9, 5.0),
    ("select", "select\nJeffreys bands", 9.7, 5.0),
    ("pool", "pool", 12.5, 5.0),
    ("vllm", "vLLM job\nOpenAI API, verified syncs", 4.1, 3.0),
    ("envs", "episodes\non the domains' backends", 6.9, 2.05),
    ("train", "train\nGRPO on DeepSpeed, N nodes", 9.7, 3.0),
    ("ckpt", "checkpoint", 12.5, 0.7),
    ("eval", "evaluate\nSlurm array: tasks × repeats", 9.7, 0.7),
    ("db2", "results.duckdb", 6.9, 0.7),
    ("report", "pass@k, pass^k, k/k\nper domain, reports", 4.1, 0.7),
]
# (from, to, label, label offset x, y): the arrows, and what travels along them.
ARROWS = [
    ("packs", "probe", "", 0, 0), ("probe", "db1", "shards", 0, 0), ("db1", "select", "", 0, 0),
    ("select", "pool", "", 0, 0), ("pool", "train", "", 0, 0), ("train", "vllm", "weights, every step", 0, 0),
    ("vllm", "envs", "", 0, 0), ("envs", "train", "rollouts: HDF5, DuckDB rows", 1.1, -0.55),
    ("train", "ckpt", "", 0, 0), ("ckpt", "eval", "", 0, 0), ("eval", "db2", "shards", 0, 0), ("db2", "report", "", 0, 0),
]
ROW_COLOURS = {5.0: "#e3f2fd", 3.0: "#fff3e0", 2.05: "#fff3e0", 0.7: "#e8f5e9"}
BOX_W, BOX_H = 2.3, 0.95


def render_svg() -> str:
    """The picture as SVG text, the same bytes for the same data (fixed hash salt, no date)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch
    matplotlib.rcParams["svg.hashsalt"] = "tbhpc-pipeline"
    matplotlib.rcParams["svg.fonttype"] = "none"           # text stays text: the page's font, searchable
    fig, ax = plt.subplots(figsize=(11.0, 4.8))
    where = {}
    for key, label, x, y in BOXES:
        where[key] = (x, y)
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H, boxstyle="round,pad=0.02,rounding_size=0.12",
                                    facecolor=ROW_COLOURS[y], edgecolor="#455a64", linewidth=1.0))
        title, _, detail = label.partition("\n")
        ax.text(x, y + (0.15 if detail else 0), title, ha="center", va="center", fontsize=10, weight="bold")
        if detail:
            ax.text(x, y - 0.2, detail, ha="center", va="center", fontsize=7.5, color="#37474f")
    for a, b, label, lx, ly in ARROWS:
        (x0, y0), (x1, y1) = where[a], where[b]
        start, end = _edge(x0, y0, x1, y1), _edge(x1, y1, x0, y0)
        ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="-|>", color="#455a64", lw=1.2,
                                                              shrinkA=0, shrinkB=0))
        if label:
            ax.text((start[0] + end[0]) / 2 + lx, (start[1] + end[1]) / 2 + 0.13 + ly, label, ha="center", va="bottom",
                    fontsize=7.5, style="italic", color="#455a64")
    ax.set(xlim=(0.0, 13.8), ylim=(0.1, 5.6), aspect="equal")
    ax.axis("off")
    fig.subplots_adjust(0, 0, 1, 1)
    out = io.StringIO()
    fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None}, transparent=True)
    plt.close(fig)
    return out.getvalue()


def _edge(x: float, y: float, tx: float, ty: float) -> tuple[float, float]:
    """Where the line from box (x, y) towards (tx, ty) leaves the box's border."""
    dx, dy = tx - x, ty - y
    if dx == dy == 0:
        return x, y
    scale = min((BOX_W / 2) / abs(dx) if dx else float("inf"), (BOX_H / 2) / abs(dy) if dy else float("inf"))
    return x + dx * scale, y + dy * scale


if __name__ == "__main__":
    text = render_svg()
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(text)
    else:
        print(text)
