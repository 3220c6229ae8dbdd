#!/usr/bin/env bash
# Stop every daemon of the local test cluster by its PID file (never by name), newest first.
set -uo pipefail
STATE=${STATE:-/tmp/tbhpc-slurm}
stop() {  # stop PIDFILE: TERM, wait up to 10 s, then KILL
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null) || return 0
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$f"
}
for f in "$STATE"/run/slurmd-*.pid; do stop "$f"; done
stop "$STATE/run/slurmctld.pid"
stop "$STATE/run/slurmdbd.pid"
stop "$STATE/run/mariadb.pid"
stop "$STATE/munge/munged.pid"
echo "slurm/local: stopped ($STATE)"
