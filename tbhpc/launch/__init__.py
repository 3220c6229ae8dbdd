"""Launch package: executors beyond the local process pool (Slurm arrays, MPI), sbatch rendering,
requeue handling and batched status. No algorithm logic lives here: every executor runs the same
`Worker.run_chunk` / `Worker.attempt` and writes the same atomic shards."""
