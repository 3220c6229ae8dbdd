"""The Reference pages, generated from the code at every build: every `tbhpc` command and option
from the argument parsers, every config field and policy option (type, default, help) from the
dataclasses and the comment on the field's line. A new option or field appears in the site without
editing a page.

Used by the site's build hook (docs/hooks.py) and runnable alone:

    python docs/reference.py cli|configs|policies       # the Markdown on stdout
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import sys
import tokenize
import typing
from pathlib import Path

# The config dataclasses a user writes YAML for: (title, module, class, where its YAML lives).
CONFIGS = (
    ("Campaign (`tbhpc probe`, `tbhpc eval`, `tbhpc submit probe|eval`)", "tbhpc.campaign.config", "CampaignConfig",
     "jobs/probe.yaml, jobs/eval.yaml"),
    ("Training (`tbhpc train`, `tbhpc submit train`, `make train`)", "tbhpc.train.config", "TrainConfig",
     "jobs/train.yaml, jobs/train-reference.yaml, jobs/train-lora.yaml"),
    ("Serving (`tbhpc serve`)", "tbhpc.serve.config", "ServeConfig", "jobs/serve.yaml"),
    ("Slurm options (the `slurm` section of the three above)", "tbhpc.slurm_options", "SlurmOptions", "-"),
    ("OpenEnv (the `openenv` section of a campaign with `environment: openenv`)", "tbhpc.openenv.launch", "OpenEnvSpec",
     "the campaign's `openenv:` section"),
    ("The demo (`tbhpc demo`, `make demo`)", "tbhpc.demo.config", "DemoConfig", "jobs/demo-pack.yaml, jobs/demo.yaml"),
    ("Pool selection (`tbhpc select`, `api.select`)", "tbhpc.selection.pool", "SelectConfig", "command-line flags"),
)


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(action: argparse.Action) -> str:
    if action.required:
        return "required"
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(action.default, bool):
        return ""
    if isinstance(action.default, (list, tuple)) and not action.default:
        return ""
    return f"`{action.default}`"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return []


def _command(name: str, parser: argparse.ArgumentParser, help: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{name}`", "", _cell(help) if help else "", "", "```text",
           parser.format_usage().strip().replace("usage: ", ""), "```", ""]
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        what = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}`"
        choices = f" (one of {', '.join(map(str, a.choices))})" if a.choices else ""
        rows.append(f"| {what} | {_default(a)} | {_cell(a.help or '')}{choices} |")
    if rows:
        out += ["| argument | default | what |", "|---|---|---|", *rows, ""]
    for sub_name, sub, sub_help in _subcommands(parser):
        out += _command(f"{name} {sub_name}", sub, sub_help, level + 1)
    return out


def cli_markdown() -> str:
    """Every command, its usage line and a table of its arguments, in `tbhpc --help` order."""
    from tbhpc.cli import build_parser
    lines = []
    for name, sub, help in _subcommands(build_parser()):
        lines += _command(f"tbhpc {name}", sub, help, 2)
    return "\n".join(lines).rstrip() + "\n"


def field_comments(cls: type) -> dict[str, str]:
    """The comment on each field's line(s) in the class body, and comment lines right above it."""
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


def _type_name(hint) -> str:
    """A field's type as a table cell shows it: unions read "A or B" (a | inside a code span breaks the table)."""
    text = getattr(hint, "__name__", None) if not typing.get_args(hint) else None
    return (text or str(hint).replace("typing.", "")).replace(" | ", " or ")


def _field_default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return f"`{f.default!r}`"
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        if dataclasses.is_dataclass(value):
            return "see below" if type(value).__name__ == "SlurmOptions" else "a section"
        return f"`{value!r}`"
    return "required"


def config_markdown() -> str:
    """One table per config class: field, type, default, and what it means."""
    import importlib
    lines = []
    for title, module, name, yaml in CONFIGS:
        cls = getattr(importlib.import_module(module), name)
        hints, helps = typing.get_type_hints(cls), field_comments(cls)
        doc = inspect.getdoc(cls) or ""
        doc = "" if doc.startswith(f"{name}(") else doc.split("\n\n")[0]      # dataclasses invent one
        lines += [f"## {title}", "", f"`{module}.{name}`; YAML: {yaml}.", "", doc, "",
                  "| field | type | default | what |", "|---|---|---|---|"]
        for f in dataclasses.fields(cls):
            if f.name.startswith("_"):
                continue
            kind = _type_name(hints.get(f.name))
            lines.append(f"| `{f.name}` | `{_cell(kind)}` | {_cell(_field_default(f))} | "
                         f"{_cell(helps.get(f.name, ''))} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def policy_options(name: str) -> list[tuple[str, str, str, str]]:
    """(option, type, default, help) for each option of a policy, as `policy_opts` spells them:
    a policy's own fields and, for one that takes sampling settings flat, Sampling's (with that
    policy's defaults). Fields a user cannot give (internal state, callables) are left out."""
    from tbhpc.policy import policy_class
    from tbhpc.policy.sampling import Sampling
    cls = policy_class(name)
    hints, helps = typing.get_type_hints(cls), field_comments(cls)
    flat = getattr(cls, "sampling_options", None) or {}
    rows = []
    for f in dataclasses.fields(cls):
        kind = _type_name(hints.get(f.name))
        if f.name == "name" or f.name.startswith("_") or not f.repr or "Callable" in kind or (flat and f.name == "sampling"):
            continue
        rows.append((f.name, kind, _field_default(f), helps.get(f.name, "")))
    if flat:
        sampling = next(f for f in dataclasses.fields(cls) if f.name == "sampling").default_factory()
        kinds, sampling_helps = typing.get_type_hints(Sampling), field_comments(Sampling)
        for option, field_name in flat.items():
            rows.append((option, _type_name(kinds[field_name]), f"`{getattr(sampling, field_name)!r}`",
                         sampling_helps.get(field_name, "")))
    return rows


def policy_markdown() -> str:
    """One table per policy: the options `policy_opts` (or `--opt`) takes."""
    from tbhpc.policy import POLICY_NAMES
    lines = ["## Policy options (`policy_opts`, `--opt`)", "",
             "What each `policy:` takes in `policy_opts: {...}` (campaign configs, `tbhpc probe|eval`) or as "
             "`--opt key=value` (`tbhpc episode`); a misspelt option or a wrong type is one line naming it.", ""]
    for name in POLICY_NAMES:
        rows = policy_options(name)
        lines += [f"### `{name}`", ""]
        if not rows:
            lines += ["No options.", ""]
            continue
        lines += ["| option | type | default | what |", "|---|---|---|---|"]
        lines += [f"| `{o}` | `{_cell(t)}` | {_cell(d)} | {_cell(h)} |" for o, t, d, h in rows]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    print({"cli": cli_markdown, "configs": config_markdown, "policies": policy_markdown}[sys.argv[1]](), end="")
