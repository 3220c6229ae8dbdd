"""What each config field means, read from the code: name, type, default and the comment on the
field's line. One source for the site's Configuration reference (docs/reference.py), `tbhpc fields`
and the one-line answer to a misspelt field (tbhpc.config), so the three never disagree.

Why comments and not docstrings: a config's fields are documented where they are declared, one
line each (`lr: float = 1e-6   # AdamW's; the recipe's`), which is what a reader of the class sees.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import typing

# Every config kind a user writes (YAML, `key=value`): kind -> "module:Class". `tbhpc fields KIND`
# lists one; a misspelt field's error names the kind's command.
KINDS = {
    "campaign": "tbhpc.campaign.config:CampaignConfig",
    "train": "tbhpc.train.config:TrainConfig",
    "serve": "tbhpc.serve.config:ServeConfig",
    "slurm": "tbhpc.slurm_options:SlurmOptions",
    "container": "tbhpc.slurm_options:ContainerOptions",
    "openenv": "tbhpc.openenv.launch:OpenEnvSpec",
    "demo": "tbhpc.demo.config:DemoConfig",
    "select": "tbhpc.selection.pool:SelectConfig",
}


def config_class(kind: str) -> type:
    module, name = KINDS[kind].split(":")
    return getattr(importlib.import_module(module), name)


def kind_of(cls: type) -> str | None:
    """The kind of a config class, by its name (no import: tbhpc.config sits below every config)."""
    return next((k for k, v in KINDS.items() if v.endswith(":" + cls.__name__)), None)


def closest(name: str, known: typing.Iterable[str], n: int = 3) -> list[str]:
    """The known names a misspelt `name` most likely meant: by similarity, else by containment."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=n, cutoff=0.6)
    if not close:
        low = name.lower()
        close = [k for k in known if low and (low in k.lower() or k.lower() in low)][:n]
    return close


def field_comments(cls: type) -> dict[str, str]:
    """The comment on each field's line(s) in the class body, and comment lines right above it."""
    import ast
    import inspect
    import io
    import tokenize
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    body = ast.parse(source).body[0]
    out = {}
    for node in getattr(body, "body", []):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = [comments[i] for i in range(node.lineno, (node.end_lineno or node.lineno) + 1) if i in comments]
            above, line = [], node.lineno - 1
            while line in comments and source.splitlines()[line - 1].strip().startswith("#"):
                above.insert(0, comments[line])
                line -= 1
            out[node.target.id] = " ".join(above + text)
    return out


def type_name(hint) -> str:
    """A field's type as a table cell shows it: unions read "A or B" (a | inside a code span breaks the table)."""
    text = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return (text or str(hint).replace("typing.", "")).replace(" | ", " or ")


def field_default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "see below" if type(value).__name__ in ("SlurmOptions", "ContainerOptions") else "a section"
        return f"`{value!r}`"
    return "required"


def config_rows(cls: type) -> list[tuple[str, str, str, str]]:
    """(field, type, default, what) for each field a user can write."""
    hints, helps = typing.get_type_hints(cls), field_comments(cls)
    return [(f.name, type_name(hints.get(f.name)), field_default(f), helps.get(f.name, ""))
            for f in dataclasses.fields(cls) if not f.name.startswith("_")]
