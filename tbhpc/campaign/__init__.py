"""Campaigns package: config and planning (`config`), the unit of work (`worker`), executors
(`executors`), the driver that creates, resumes and merges a run (`runner`), completeness checks
(`validate`). Kept import-free so that a Slurm array task or MPI rank pays only for the worker."""
