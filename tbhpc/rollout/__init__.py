"""Rollout package: token-exact training episodes and their HDF5 buffers (what the trainer reads)."""
