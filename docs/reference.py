"""The Reference pages, generated from the code at every build: every `tbhpc` command and option
from the argument parsers, every config field and policy option (type, default, help) from the
dataclasses and the comment on the field's line. A new option or field appears in the site without
editing a page.

Used by the site's build hook (docs/hooks.py) and runnable alone:

    python docs/reference.py cli|configs|policies       # the Markdown on stdout
"""
from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

# The config kinds a user writes YAML for (tbhpc/fielddoc.py's KINDS): (title, kind, where its YAML lives).
CONFIGS = (
    ("Campaign (`tbhpc probe`, `tbhpc eval`, `tbhpc submit probe|eval`)", "campaign", "jobs/probe.yaml, jobs/eval.yaml"),
    ("Training (`tbhpc train`, `tbhpc submit train`, `make train`)", "train",
     "jobs/train.yaml, jobs/train-reference.yaml, jobs/train-lora.yaml"),
    ("Serving (`tbhpc serve`)", "serve", "jobs/serve.yaml"),
    ("Slurm options (the `slurm` section of the three above)", "slurm", "-"),
    ("Containers (the `container` section of `slurm`)", "container", "-"),
    ("OpenEnv (the `openenv` section of a campaign with `environment: openenv`)", "openenv", "the campaign's `openenv:` section"),
    ("The demo (`tbhpc demo`, `make demo`)", "demo", "jobs/demo-pack.yaml, jobs/demo.yaml"),
    ("Pool selection (`tbhpc select`, `api.select`)", "select", "command-line flags"),
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


def config_markdown() -> str:
    """One table per config kind: field, type, default, and what it means (`tbhpc fields KIND` prints the same)."""
    from tbhpc.fielddoc import KINDS, config_class, config_rows
    lines = []
    for title, kind, yaml in CONFIGS:
        cls, (module, name) = config_class(kind), KINDS[kind].split(":")
        doc = inspect.getdoc(cls) or ""
        doc = "" if doc.startswith(f"{name}(") else doc.split("\n\n")[0]      # dataclasses invent one
        lines += [f"## {title}", "", f"`{module}.{name}`; YAML: {yaml}; every field in a terminal: `tbhpc fields {kind}`.",
                  "", doc, "", "| field | type | default | what |", "|---|---|---|---|"]
        for field, kind_, default, what in config_rows(cls):
            lines.append(f"| `{field}` | `{_cell(kind_)}` | {_cell(default)} | {_cell(what)} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def policy_markdown() -> str:
    """One table per policy: the options `policy_opts` (or `--opt`) takes."""
    from tbhpc.cli.fields import policy_rows
    from tbhpc.policy import POLICY_NAMES
    lines = ["## Policy options (`policy_opts`, `--opt`)", "",
             "What each `policy:` takes in `policy_opts: {...}` (campaign configs, `tbhpc probe|eval`) or as "
             "`--opt key=value` (`tbhpc episode`); a misspelt option or a wrong type is one line naming it.", ""]
    for name in POLICY_NAMES:
        rows = policy_rows(name)
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
