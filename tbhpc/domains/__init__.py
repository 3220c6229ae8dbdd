"""The five built-in domains. Each sub-package holds its tables and tools (`__init__.py`),
seed data (`seed.yaml`), scenario with policy manual (`scenario.yaml`) and task templates
(`templates.py`). Imported lazily by name so loading one domain never loads the others."""
from __future__ import annotations

import importlib
from functools import lru_cache

from tbhpc.env.domain import Domain

DOMAIN_NAMES = ("retail", "insurance", "travel", "neobank", "consulting")


@lru_cache(maxsize=None)
def get_domain(name: str) -> Domain:
    if name not in DOMAIN_NAMES:
        raise KeyError(f"unknown domain {name!r} (known: {', '.join(DOMAIN_NAMES)})")
    return importlib.import_module(f"tbhpc.domains.{name}").DOMAIN


def all_domains() -> dict[str, Domain]:
    return {n: get_domain(n) for n in DOMAIN_NAMES}


def catalogs(names=None) -> dict:
    """Catalogues of the named built-in domains (all by default); unknown names are skipped so
    that the validator can report them against the task that uses them."""
    wanted = DOMAIN_NAMES if names is None else [n for n in DOMAIN_NAMES if n in set(names)]
    return {n: get_domain(n).catalog() for n in wanted}
