"""The OpenMP wait policy `tbhpc train` sets before torch loads (tbhpc/openmp.py; the speed-up
itself is measured by bench/omp_teams.py, not here)."""
import os
import subprocess
import sys

from tbhpc.openmp import SPIN_POLICY, spin_policy_updates


def test_the_spin_policy_is_set_only_when_the_user_chose_none():
    assert spin_policy_updates({}) == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}
    assert spin_policy_updates({"OMP_WAIT_POLICY": "PASSIVE"}) == {}
    assert spin_policy_updates({"GOMP_SPINCOUNT": "0"}) == {}


PROBE = """
import os, sys
from tbhpc import cli
try:
    cli.main(sys.argv[1:])
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT"), "torch" in sys.modules)
"""


def _probe(args, **env):
    base = {k: v for k, v in os.environ.items() if k not in SPIN_POLICY}
    out = subprocess.run([sys.executable, "-c", PROBE, *args], env={**base, **env}, capture_output=True, text=True,
                         timeout=120)
    return out.stdout.strip().splitlines()[-1].split()


def test_train_sets_it_before_torch_loads_and_other_commands_do_not(tmp_path):
    # a run directory that does not exist: train fails with its one-line error, after the policy is set
    assert _probe(["train", str(tmp_path / "missing")]) == ["ACTIVE", "300000", "False"]
    assert _probe(["tasks", "list", "--format", "json"])[:2] == ["None", "None"]
    assert _probe(["train", str(tmp_path / "missing")], OMP_WAIT_POLICY="PASSIVE")[:2] == ["PASSIVE", "None"]
