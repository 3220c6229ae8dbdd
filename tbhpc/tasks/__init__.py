"""Tasks package: the task and scenario schema, declarative loading of packs, validation, splits.

Must not import env or policy code: a pack is data, checked against a tool catalogue that the
caller hands in.
"""
from tbhpc.tasks.schema import GoldenCall, Rubric, Scenario, Task
from tbhpc.tasks.loader import load_pack, load_scenario, default_pack_dir

__all__ = ["GoldenCall", "Rubric", "Scenario", "Task", "load_pack", "load_scenario", "default_pack_dir"]
