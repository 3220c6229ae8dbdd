"""Which Environment runs a task: its built-in domain, its ThinkingBox scenario's MCP servers,
or an OpenEnv environment.

Why one resolver: campaign workers, training rollouts and the episode command all hold tasks
and need "the environment for this task". A built-in task (`task.backend == {}`) runs in
process; a task whose backend says `tb-mcp` runs on the servers named by a servers file, with
the worker's warm pools shared across all scenarios that use the same server. With an OpenEnv
spec every task runs on that environment (reached by URL, or launched here and stopped at close).
"""
from __future__ import annotations

import sys
import threading
from pathlib import Path

from tbhpc.env.session import Environment
from tbhpc.errors import UserError
from tbhpc.tasks.schema import Task


class Environments:
    def __init__(self, servers_file: str | Path | None = None, announce: bool = False, openenv=None):
        if servers_file and not Path(servers_file).is_file():
            raise UserError(f"--servers {servers_file}: not a file (the MCP servers file)")
        self.servers_file, self.announce = servers_file, announce   # announce: say what the environment lacks (once)
        self.openenv = openenv            # an OpenEnvSpec: every task runs there
        self._openenv_env = self._launched = None
        self._lock = threading.Lock()      # worker threads ask at once; one launch
        self._specs = None
        self._pools: dict = {}
        self._datasets: dict = {}
        self._envs: dict = {}

    def for_task(self, task: Task) -> Environment:
        if self.openenv is not None:
            return self._remote()
        if not task.backend:
            from tbhpc.domains import get_domain
            return get_domain(task.domain)
        kind = task.backend.get("kind")
        from tbhpc.tb.dataset import BACKEND_KIND
        if kind != BACKEND_KIND:
            raise UserError(f"task {task.id}: unknown backend kind {kind!r} (known: {BACKEND_KIND})")
        key = (task.backend["source"], task.backend["scenario"])
        if key not in self._envs:
            self._envs[key] = self._mcp_env(*key)
        return self._envs[key]

    def _mcp_env(self, source: str, scenario: str):
        require_mcp()
        from tbhpc.mcp.client import ServerPool, register
        from tbhpc.mcp.env import MCPEnvironment
        from tbhpc.mcp.servers import load_servers, search_answers
        from tbhpc.tb.dataset import TBDataset
        if self.servers_file is None:
            raise UserError(f"scenario {scenario} runs on MCP tool servers: give a servers file (servers=FILE)")
        if self._specs is None:
            self._specs = load_servers(self.servers_file)
            self._pools = {name: register(ServerPool(spec)) for name, spec in self._specs.servers.items()}
            self._no_search = bool(self._specs.search_check) and not search_answers(self._specs.search_check)
            if self._no_search and self.announce:
                print(f"tbhpc: the policy-search backend {self._specs.search_check} does not answer: attempts run "
                      "without policy search (sources removed from init; recorded as env_degraded=no_policy_search)",
                      file=sys.stderr, flush=True)
        if source not in self._datasets:
            self._datasets[source] = TBDataset(source)
        return MCPEnvironment(self._datasets[source].scenario(scenario), self._pools, strip_sources=self._no_search)

    def _remote(self):
        with self._lock:
            if self._openenv_env is None:
                from tbhpc.openenv.launch import Launched
                from tbhpc.openenv.remote import OpenEnvEnvironment
                url = self.openenv.url
                if url is None:
                    self._launched = Launched(self.openenv)
                    url = self._launched.url
                self._openenv_env = OpenEnvEnvironment(url, timeout_s=self.openenv.timeout_s)
            return self._openenv_env

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        if self._launched is not None:
            self._launched.stop()
            self._launched = self._openenv_env = None


def preflight(tasks: list[Task], servers_file: str | Path | None, openenv=None) -> None:
    """Before a campaign plans anything: every MCP task's servers are defined, start, offer every
    tool its scenario whitelists, and return `{}` to one real `__reserved__init` (with the first
    task's config, then torn down); an OpenEnv environment answers, opens the first task and lists
    its tools. A mistake in the servers file, the scenario, the servers' installation or the
    environment's address is then one clear line, not a system error on every attempt of an array task."""
    if openenv is not None:
        return _preflight_openenv(tasks, openenv)
    firsts: dict[tuple, Task] = {}
    for t in tasks:
        if t.backend:
            firsts.setdefault((t.backend.get("source"), t.backend.get("scenario")), t)
    if not firsts:
        return
    from tbhpc.errors import InfraError
    envs = Environments(servers_file, announce=True)
    try:
        for (_, scenario), task in firsts.items():
            try:
                envs.for_task(task).check(task)
            except InfraError as exc:
                raise UserError(f"{servers_file}: servers check failed for scenario {scenario} (task {task.id}): {exc}") from None
    finally:
        envs.close()


def _preflight_openenv(tasks: list[Task], spec) -> None:
    """The environment answers, serves every task asked of it (where it lists its tasks), and opens
    the first one."""
    from tbhpc.errors import InfraError
    from tbhpc.openenv.remote import served_task_ids
    envs = Environments(openenv=spec)
    try:
        env = envs.for_task(tasks[0])
        offered = served_task_ids(env.url)
        missing = [t.id for t in tasks if offered is not None and t.id not in offered]
        if missing:
            raise UserError(f"field 'openenv': {len(missing)} task(s) are not served by the environment at {env.url} "
                            f"(first: {missing[0]}; it serves {len(offered)})")
        session = env.open(tasks[0])
        try:
            session.system_prompt(env.agent_prompt), session.max_agent_turns()     # what every attempt reads first
        finally:
            session.close()
    except InfraError as exc:
        raise UserError(f"field 'openenv': the environment cannot run task {tasks[0].id}: {exc}") from None
    finally:
        envs.close()


def require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise UserError("MCP tool servers need the mcp package: pip install -e '.[mcp]' (make env installs it)") from None
