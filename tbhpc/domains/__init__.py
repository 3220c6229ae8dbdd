"""The five built-in domains. Each sub-package holds its tables and tools (`__init__.py`),
seed data (`seed.yaml`), scenario with policy manual (`scenario.yaml`) and task templates
(`templates.py`). Imported lazily by name so loading one domain never loads the others.
`demo/` holds the same five businesses in the compact form of the demo pack (`demo_<name>`)."""
from __future__ import annotations

import importlib
from functools import lru_cache

from tbhpc.env.domain import Domain

DOMAIN_NAMES = ("retail", "insurance", "travel", "neobank", "consulting")
DEMO_DOMAIN_NAMES = ("demo_retail", "demo_insurance", "demo_travel", "demo_neobank", "demo_consulting")
KNOWN = DOMAIN_NAMES + DEMO_DOMAIN_NAMES


@lru_cache(maxsize=None)
def get_domain(name: str) -> Domain:
    if name in DEMO_DOMAIN_NAMES:
        return importlib.import_module(f"tbhpc.domains.demo.{name.removeprefix('demo_')}").DOMAIN
    if name not in DOMAIN_NAMES:
        raise KeyError(f"unknown domain {name!r} (known: {', '.join(KNOWN)})")
    return importlib.import_module(f"tbhpc.domains.{name}").DOMAIN


def all_domains() -> dict[str, Domain]:
    return {n: get_domain(n) for n in DOMAIN_NAMES}


def catalogs(names=None) -> dict:
    """Catalogues of the named built-in domains (all by default); unknown names are skipped so
    that the validator can report them against the task that uses them."""
    wanted = DOMAIN_NAMES if names is None else [n for n in KNOWN if n in set(names)]
    return {n: get_domain(n).catalog() for n in wanted}
