"""Env package: domain backends, tools, the episode loop, simulated users, judges and grading.

Knows nothing about Slurm or training: an episode is a pure function of (task, policy, user,
judge) that returns a result record.
"""
