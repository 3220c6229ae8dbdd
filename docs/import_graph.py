"""The import graph of `tbhpc/`: files as nodes, imports as arrows, read from the source with `ast`
(nothing is imported or run). It draws docs/import-graph.png, prints the counts docs/architecture.md
gives (circles, arrows up, largest files), and with `--check` fails when a circle or an arrow up
that is not in ALLOWED_UP appears, so the layering cannot rot silently (tests/test_architecture.py).

Every import counts, as a reader counts it: one inside a function (a local import hides a circle
from Python's import order, not from a reader) and one under `if TYPE_CHECKING:` (it does not run,
but a reader still follows it). A circle stays only when it is listed in ALLOWED_CIRCLES with the
reason it must.

    python docs/import_graph.py [--root DIR] [--png FILE] [--check]
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

# Bottom to top. A file may import files of its own layer and of layers below; an import of a
# higher layer is an arrow up. Top-level modules and packages are named by their first component.
LAYERS: list[tuple[str, list[str]]] = [
    ("foundation", ["errors", "config", "argcheck", "crash", "interrupts", "outpaths", "progress", "openmp",
                    "llm_client", "slurm_options", "cpuinfo", "fielddoc", "envlock"]),
    ("tasks and records", ["tasks", "tb", "interpret", "store"]),
    ("environments", ["env", "domains", "mcp", "openenv"]),
    ("analysis", ["metrics", "selection", "plan"]),
    ("policies and serving", ["policy", "agents", "serve", "rollout"]),
    ("workloads and reports", ["campaign", "train", "report", "track"]),
    ("launch", ["launch"]),
    ("entry points", ["api", "demo", "doctor", "cli"]),
]

# Arrows up that stay, each with the reason a reader needs. (importer, imported) as module names.
ALLOWED_UP: dict[tuple[str, str], str] = {
    ("tbhpc.tasks.checked", "tbhpc.domains"):
        "a pack is checked against the tool catalogues of the built-in domains its tasks name, and those "
        "catalogues are the domains' Python tool definitions; imported when a check runs, so reading a pack "
        "loads no backend",
}

# Circles that stay, each with the reason a reader needs: only a circle that annotations alone close
# (it is gone from the graph of imports that run) may be listed. Keyed by the circle's files, sorted.
ALLOWED_CIRCLES: dict[tuple[str, ...], str] = {
    ("tbhpc.train.checks", "tbhpc.train.config"):
        "checks.py is TrainConfig's validation, apart for size (config.py would hold 400 lines of two jobs); "
        "TrainConfig's __post_init__ calls it, and it names TrainConfig only in annotations (TYPE_CHECKING)",
}


@dataclass
class Graph:
    modules: dict[str, Path]
    edges: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    typing_only: set[tuple[str, str]] = field(default_factory=set)      # arrows only `if TYPE_CHECKING:` draws

    def runtime(self) -> "Graph":
        """The graph without the arrows that exist only for type annotations."""
        return Graph(self.modules, defaultdict(set, {a: {b for b in bs if (a, b) not in self.typing_only}
                                                     for a, bs in self.edges.items()}))

    def lines(self, module: str) -> int:
        return len(self.modules[module].read_text().splitlines())


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_nodes(tree: ast.AST):
    """(import, whether it sits under `if TYPE_CHECKING:`) for every import, inside functions too."""
    stack = [(tree, False)]
    while stack:
        node, typing_only = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, typing_only
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend((n, True) for n in node.body)
            stack.extend((n, typing_only) for n in node.orelse)
            continue
        stack.extend((n, typing_only) for n in ast.iter_child_nodes(node))


def read_graph(root: Path) -> Graph:
    modules = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = Graph(modules)
    pkg = root.name

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    for mod, path in modules.items():
        runtime = set()
        for node, typing_only in _import_nodes(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == pkg]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] == pkg:
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]
            for t in targets:
                target = resolve(t)
                if target and target != mod:
                    graph.edges[mod].add(target)
                    if not typing_only:
                        runtime.add(target)
        graph.typing_only.update((mod, t) for t in graph.edges.get(mod, ()) if t not in runtime)
    return graph


def part(module: str) -> str:
    """The layer unit of a module: its top-level package or module (`tbhpc.cli_x` -> `cli`)."""
    first = module.split(".")[1] if "." in module else module
    return "cli" if first.startswith("cli") else first


LAYER_OF = {name: i for i, (_, names) in enumerate(LAYERS) for name in names}


def layer(module: str) -> int:
    try:
        return LAYER_OF[part(module)]
    except KeyError:
        raise SystemExit(f"docs/import_graph.py: {module} is in no layer: add {part(module)!r} to LAYERS") from None


def circles(graph: Graph) -> list[list[str]]:
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in graph.modules:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.edges.get(start, ()))))]
        index[start] = low[start] = counter[0]; counter[0] += 1
        stack.append(start); on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]; counter[0] += 1
                    stack.append(w); on.add(w)
                    work.append((w, iter(sorted(graph.edges.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop(); on.discard(w); comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return sorted(out)


def arrows_up(graph: Graph) -> list[tuple[str, str]]:
    return sorted((a, b) for a, bs in graph.edges.items() for b in bs if layer(b) > layer(a))


def circle_allowed(graph: Graph, circle: list[str]) -> bool:
    """Listed in ALLOWED_CIRCLES, and closed only by annotations (no circle of running imports holds it)."""
    return tuple(circle) in ALLOWED_CIRCLES and not any(set(circle) & set(c) for c in circles(graph.runtime()))


def summary(graph: Graph) -> str:
    loops, up = circles(graph), arrows_up(graph)
    n_edges = sum(len(b) for b in graph.edges.values())
    sizes = sorted(((graph.lines(m), m) for m in graph.modules), reverse=True)
    listed = sum(1 for c in loops if circle_allowed(graph, c))
    lines = [f"files {len(graph.modules)}, imports {n_edges}, circles {len(loops)} "
             f"({sum(len(c) for c in loops)} files; {len(loops) - listed} unlisted), arrows up {len(up)} ({len([u for u in up if u not in ALLOWED_UP])} "
             f"unexplained), files over 350 lines {sum(1 for n, _ in sizes if n > 350)}"]
    lines += [f"circle: {' <-> '.join(c)}" + (f"  (listed: {ALLOWED_CIRCLES[tuple(c)]})" if circle_allowed(graph, c) else "")
              for c in loops]
    lines += [f"up: {a} -> {b}" + (f"  ({ALLOWED_UP[(a, b)]})" if (a, b) in ALLOWED_UP else "") for a, b in up]
    lines += [f"largest: {m} {n}" for n, m in sizes[:5]]
    return "\n".join(lines)


def draw(graph: Graph, png: Path, title: str) -> None:
    """Layers as rows (bottom = foundation), packages as clusters of file dots within their row;
    ordinary imports grey, arrows up red, imports inside a circle orange."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_part: dict[str, list[str]] = defaultdict(list)
    for m in graph.modules:
        by_part[part(m)].append(m)
    pos: dict[str, tuple[float, float]] = {}
    label_at: dict[str, tuple[float, float]] = {}
    for li, (_, names) in enumerate(LAYERS):
        present = [n for n in names if n in by_part]
        width = sum(max(1.0, len(by_part[n]) ** 0.5) for n in present) + len(present)
        x = -width / 2
        for name in present:
            files = sorted(by_part[name])
            side = max(1, int(len(files) ** 0.5 + 0.999))
            for i, m in enumerate(files):
                pos[m] = (x + (i % side) * 0.9, li * 4 + (i // side) * 0.45)
            label_at[name] = (x + (side - 1) * 0.45, li * 4 - 0.8)
            x += side * 0.9 + 1.2
    in_circle = {(a, b) for c in circles(graph) for a in c for b in c if b in graph.edges.get(a, ())}
    up = set(arrows_up(graph))
    fig, ax = plt.subplots(figsize=(18, 11))
    for kind, colour, width, alpha in (("plain", "#999999", 0.3, 0.25), ("circle", "#e68a00", 1.4, 0.9),
                                       ("up", "#d62728", 1.4, 0.9)):
        for a, bs in graph.edges.items():
            for b in bs:
                k = "circle" if (a, b) in in_circle else "up" if (a, b) in up else "plain"
                if k == kind:
                    ax.annotate("", xy=pos[b], xytext=pos[a], arrowprops=dict(arrowstyle="-|>", color=colour, lw=width,
                                                                              alpha=alpha, shrinkA=2, shrinkB=2))
    xs, ys = zip(*pos.values())
    sizes = [6 + graph.lines(m) / 12 for m in pos]
    ax.scatter(xs, ys, s=sizes, c="#1f77b4", zorder=3)
    for name, (x, y) in label_at.items():
        ax.text(x, y, name, ha="center", va="top", fontsize=9)
    for li, (label, _) in enumerate(LAYERS):
        ax.text(min(xs) - 3, li * 4, label, ha="right", va="center", fontsize=10, weight="bold")
    ax.set_title(title, fontsize=12)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent / "tbhpc")
    ap.add_argument("--png", type=Path, default=None, help="draw the graph into this file")
    ap.add_argument("--title", default="tbhpc imports")
    ap.add_argument("--check", action="store_true", help="exit 1 on a circle or an unexplained arrow up")
    args = ap.parse_args(argv)
    graph = read_graph(args.root)
    text = summary(graph)
    print(text)
    if args.png:
        draw(graph, args.png, f"{args.title}: {text.splitlines()[0]}")
    if args.check:
        loops = circles(graph)
        bad = [c for c in loops if not circle_allowed(graph, c)] + [u for u in arrows_up(graph) if u not in ALLOWED_UP]
        stale = [k for k in ALLOWED_UP if k not in set(arrows_up(graph))] + \
                [k for k in ALLOWED_CIRCLES if list(k) not in loops]
        if bad or stale:
            print(f"import_graph: {len(bad)} unlisted circles or unexplained arrows up, {len(stale)} stale ALLOWED_UP or "
                  "ALLOWED_CIRCLES entries", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
