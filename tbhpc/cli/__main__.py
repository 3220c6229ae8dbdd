"""`python -m tbhpc.cli ...` is the `tbhpc` command (Slurm scripts and tests call it so)."""
from tbhpc.cli import entry

entry()
