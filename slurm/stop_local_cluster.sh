#!/usr/bin/env bash
# Stop the cluster that slurm/start_local_cluster.sh started, and nothing else:
# the daemons are found by the pid files under
# ${SLURM_LOCAL_DIR:-/tmp/ddp-local-slurm}. Jobs still running there are
# cancelled first, so no slurmstepd is left behind. Safe to run twice.
# Files (logs, config) stay for inspection; delete the folder to forget them.
# A network made by --link-rate is removed after the daemons: exactly the
# namespaces, veths and bridge named in $DIR/network.record (their qdiscs go
# with the veths), also when the start failed halfway.
#
#   sudo slurm/stop_local_cluster.sh
set -uo pipefail

DIR=${SLURM_LOCAL_DIR:-/tmp/ddp-local-slurm}
CONF=$DIR/slurm.conf

say() { echo "stop_local_cluster.sh: $*"; }

# A process that has exited but not yet been reaped (state Z) counts as gone.
running() {
    [ -r "/proc/$1/stat" ] && [ "$(sed 's/.*) //' "/proc/$1/stat" | cut -d' ' -f1)" != Z ]
}

pid_of() {  # pid_of <pid file> <program name>: the pid, if that daemon is alive
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1")
    running "$pid" && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ] && echo "$pid"
}

# Step daemons of this cluster: slurmstepd processes holding a file under DIR
# (their sockets live in its spool folder).
stepds_of_this_cluster() {
    local pid fd
    for pid in $(pgrep -x slurmstepd 2>/dev/null); do
        running "$pid" || continue
        for fd in /proc/"$pid"/fd/*; do
            if [[ "$(readlink "$fd" 2>/dev/null)" == "$DIR/"* ]]; then echo "$pid"; break; fi
        done
    done
}

descendants() {  # descendants <pid>...: every process below them
    local table queue=("$@") pid child
    table=$(ps -eo pid=,ppid=)
    while [ ${#queue[@]} -gt 0 ]; do
        pid=${queue[0]}
        queue=("${queue[@]:1}")
        while read -r child; do
            echo "$child"
            queue+=("$child")
        done < <(awk -v parent="$pid" '$2 == parent {print $1}' <<<"$table")
    done
}

stop() {  # stop <name> <seconds> <pid>...: TERM, wait up to <seconds>, then KILL
    local name=$1 grace=$2 pid; shift 2
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null
    for _ in $(seq $((grace * 5))); do
        local left=0
        for pid in "$@"; do running "$pid" && left=1; done
        [ "$left" -eq 0 ] && { say "stopped $name"; return 0; }
        sleep 0.2
    done
    kill -KILL "$@" 2>/dev/null
    say "killed $name (did not stop within $grace s)"
}

if pid_of "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
    jobs=$(SLURM_CONF=$CONF squeue --noheader --format=%i 2>/dev/null)
    if [ -n "$jobs" ]; then
        # shellcheck disable=SC2086
        SLURM_CONF=$CONF scancel $jobs 2>/dev/null && say "cancelled jobs: ${jobs//$'\n'/ }"
        for _ in $(seq 50); do
            [ -z "$(stepds_of_this_cluster)" ] && break
            sleep 0.2
        done
    fi
fi

# Left over when slurmctld was already gone: end the jobs' processes, then
# their step daemons.
stepds=$(stepds_of_this_cluster)
if [ -n "$stepds" ]; then
    # shellcheck disable=SC2046,SC2086
    stop "processes of leftover jobs" 5 $(descendants $stepds)
    # shellcheck disable=SC2086
    stop "leftover slurmstepd" 2 $stepds
fi
for pid_file in "$DIR"/run/slurmd-*.pid; do
    if pid=$(pid_of "$pid_file" slurmd); then
        stop "slurmd ($(basename "$pid_file" .pid))" 10 "$pid"
    fi
done
if pid=$(pid_of "$DIR/run/slurmctld.pid" slurmctld); then stop slurmctld 10 "$pid"; fi
if pid=$(pid_of "$DIR/munge/munged.pid" munged); then stop munged 10 "$pid"; fi
rm -f "$DIR"/run/*.pid "$DIR/munge/munged.pid"

if [ -f "$DIR/network.record" ]; then
    HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
    if (cd "$HERE/.." && "${PYTHON:-python3}" -m runtime.emulated_network down \
            --record "$DIR/network.record"); then
        say "removed the emulated network"
    else
        say "error: some of the emulated network is left (see $DIR/network.record)" >&2
        exit 1
    fi
fi
exit 0
