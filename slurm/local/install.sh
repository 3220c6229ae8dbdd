#!/usr/bin/env bash
# Install Debian's Slurm, munge, MariaDB and OpenMPI packages for the local test cluster, without
# letting their init scripts start anything (a temporary policy-rc.d that exits 101; an existing
# one is left alone). Idempotent: does nothing when every binary is already there.
set -euo pipefail
need=(slurmctld slurmd slurmdbd munged mariadbd sbatch mpirun)
missing=0
for b in "${need[@]}"; do command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || missing=1; done
[ "$missing" = 0 ] && exit 0
created_policy=0
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  slurmctld slurmd slurm-client slurmdbd slurm-wlm-mysql-plugin munge mariadb-server \
  openmpi-bin libopenmpi-dev >/dev/null
echo "slurm/local/install.sh: packages installed"
