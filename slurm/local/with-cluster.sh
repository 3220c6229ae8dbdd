#!/usr/bin/env bash
# Run a command with the local test cluster up: start it (unless one is already running, which is
# then left running), export SLURM_CONF, run, and stop what was started, by PID file, whatever the
# command's exit status (also on Ctrl-C).   Usage: slurm/local/with-cluster.sh CMD [ARGS...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export STATE=${STATE:-/tmp/tbhpc-slurm} NODES=${NODES:-3}
started=0
if ! { [ -f "$STATE/run/slurmctld.pid" ] && kill -0 "$(cat "$STATE/run/slurmctld.pid")" 2>/dev/null; }; then
  bash "$here/up.sh" || { bash "$here/down.sh"; exit 1; }
  started=1
fi
trap '[ "$started" = 1 ] && bash "$here/down.sh"' EXIT
. "$STATE/env.sh"
export TBHPC_REQUIRE_SLURM=1
"$@"
