"""A domain = typed tables + seed data + tools + scenario; it hands out private backends.

Why one object: the episode loop, the golden replay, the pack validator and the benchmarks all
need "a fresh copy of this domain with this task's patch applied" and "the tools this scenario
whitelists". The template image is built once per process and reused for every episode.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from tbhpc.env.common_tools import TICKET_TABLES, manual, manual_index_setup, tickets
from tbhpc.env.db import Backend, Table, build_template, open_copy
from tbhpc.env.local import LocalSession
from tbhpc.env.tools import Tool, ToolBox, ToolRegistry
from tbhpc.tasks.loader import DomainCatalog, load_scenario
from tbhpc.tasks.schema import Scenario, Task


@dataclass
class Domain:
    name: str
    package_dir: Path
    tables: tuple[Table, ...]
    registry: ToolRegistry
    customer_table: str = "customers"
    meta: dict[str, Any] = field(default_factory=dict)
    scenario_file: str = "scenario.yaml"     # in package_dir
    seed_file: str | None = "seed.yaml"      # in package_dir; None: the tables start empty (tasks patch in every row)

    @cached_property
    def scenario(self) -> Scenario:
        return load_scenario(self.package_dir / self.scenario_file)

    @cached_property
    def seed(self) -> dict[str, list[dict]]:
        if self.seed_file is None:
            return {}
        return yaml.safe_load((self.package_dir / self.seed_file).read_text(encoding="utf-8")) or {}

    @cached_property
    def all_tables(self) -> dict[str, Table]:
        return {t.name: t for t in self.tables + TICKET_TABLES}

    @cached_property
    def all_tools(self) -> dict[str, Tool]:
        return self.registry.merged(tickets, manual).tools

    @cached_property
    def tools(self) -> dict[str, Tool]:
        """The scenario's whitelist, in whitelist order. Unknown names fail loudly."""
        missing = [n for n in self.scenario.tools if n not in self.all_tools]
        if missing:
            raise ValueError(f"scenario {self.name}: whitelisted tools not implemented: {missing}")
        return {n: self.all_tools[n] for n in self.scenario.tools}

    @cached_property
    def tool_schemas(self) -> list[dict]:
        """The whitelisted tools' OpenAI schemas: one list object for every attempt (transcripts
        store it once by reference)."""
        return [t.openai_schema for t in self.tools.values()]

    @cached_property
    def template(self) -> bytes:
        return build_template(self.all_tables.values(), self.seed, manual_index_setup(self.scenario.manual))

    def catalog(self) -> DomainCatalog:
        return DomainCatalog(
            tools={n: t.parameters for n, t in self.tools.items()},
            tables={n: frozenset(t.column_names) for n, t in self.all_tables.items()},
            read_only_tools=frozenset(n for n, t in self.tools.items() if not t.mutates),
        )

    def backend(self, task: Task | None = None) -> Backend:
        """A fresh private copy of the seed state with the task's data patch applied."""
        b = open_copy(self.template, self.all_tables, self.scenario.current_date[:10])
        b.meta["customer_table"] = self.customer_table
        if task is not None:
            b.apply_patch(task.data_patch, task.source_file or "<task>", task.id)
        return b

    def toolbox(self, backend: Backend, timeout_s: float = 10.0) -> ToolBox:
        return ToolBox(backend, self.tools, timeout_s)

    # the Environment protocol (tbhpc.env.session): what the episode loop asks of any backend
    def system_prompt(self, agent_prompt: str) -> str:
        return self.scenario.system_prompt(agent_prompt)

    def max_agent_turns(self, task: Task) -> int:
        return self.scenario.max_agent_turns

    def open(self, task: Task, tool_timeout_s: float = 10.0):
        return LocalSession(self, task, tool_timeout_s)
