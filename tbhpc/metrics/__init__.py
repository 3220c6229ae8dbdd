"""Metrics package: reliability statistics over per-task (n, c) counts, per-domain tables, costs.
Pure functions over arrays; the store hands them counts, the CLI renders what they return."""
