#!/usr/bin/env bash
# Start a real Slurm cluster on this one machine, for trying run_slurm.sh
# without a cluster: one slurmctld and two slurmd nodes named 127.0.0.1 and
# 127.0.0.2 (every 127.x address is loopback, so the node names resolve and
# MASTER_ADDR works without /etc/hosts), authenticated by a private munged.
#
#   sudo slurm/start_local_cluster.sh          # prints the export line below
#   export SLURM_CONF=/tmp/ddp-local-slurm/slurm.conf
#   sinfo                                      # two nodes, idle
#   sudo slurm/stop_local_cluster.sh
#
# With --link-rate RATE (tc syntax: 100mbit, 1gbit, 10gbit) the nodes are on
# an emulated network instead (runtime/shaped_links.py): each slurmd in
# its own network namespace, named and addressed SUBNET.1 and SUBNET.2, on a
# Linux bridge (SUBNET.254, where slurmctld is reached) through a veth pair
# shaped to RATE in both directions by tc tbf. A node's tasks talk over its
# own loopback, unshaped; nodes talk over the shaped links. Every job task
# gets GLOO_SOCKET_IFNAME=ddplink0, the node's shaped interface, from a
# TaskProlog, so run_slurm.sh runs unchanged:
#
#   sudo slurm/start_local_cluster.sh --link-rate 1gbit
#   sinfo                                      # 10.213.1.[1-2] idle
#   sudo slurm/stop_local_cluster.sh           # also removes the network
#
# Everything (config, munge key and socket, state, spool, pid and log files)
# lives under one folder, ${SLURM_LOCAL_DIR:-/tmp/ddp-local-slurm}; nothing
# in /etc is changed. Needs root (it installs the Debian packages when they
# are missing and starts the daemons itself). Running it twice leaves one
# cluster up. Settings: SLURM_LOCAL_DIR, SLURM_LOCAL_PORT (slurmctld's port;
# the nodes use the next two, default 6817), SLURM_LOCAL_CPUS (CPUs each
# node declares, default 4, so 2 tasks per node fit on a 2-core machine),
# SLURM_LOCAL_SUBNET (with --link-rate: the first three octets, default
# 10.213.1), PYTHON (runs runtime/emulated_network.py; default python3).
set -euo pipefail

# Daemons live in sbin, which some users' PATH lacks.
PATH=$PATH:/usr/sbin:/sbin
say() { echo "start_local_cluster.sh: $*"; }
die() {  # one line on stderr; daemons this run started are stopped again
    echo "start_local_cluster.sh: error: $*" >&2
    [ -n "${STARTED:-}" ] && SLURM_LOCAL_DIR=$DIR "$HERE/stop_local_cluster.sh" >/dev/null
    exit 1
}

DIR=${SLURM_LOCAL_DIR:-/tmp/ddp-local-slurm}
PORT=${SLURM_LOCAL_PORT:-6817}
CPUS=${SLURM_LOCAL_CPUS:-4}
NODES=(127.0.0.1 127.0.0.2)
CONF=$DIR/slurm.conf
MUNGE_DIR=$DIR/munge
SOCKET=$MUNGE_DIR/munge.socket
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
LINK_RATE=""
SUBNET=${SLURM_LOCAL_SUBNET:-10.213.1}
CONTROLLER=127.0.0.1

while [ $# -gt 0 ]; do
    case "$1" in
        --link-rate) [ $# -ge 2 ] || die "--link-rate needs a rate, e.g. 1gbit"
                     LINK_RATE=$2; shift 2 ;;
        --link-rate=*) LINK_RATE=${1#*=}; shift ;;
        *) die "unknown argument '$1' (the only option is --link-rate RATE)" ;;
    esac
done

[ "$(id -u)" -eq 0 ] \
    || die "must run as root (it installs packages and starts slurmctld, slurmd and munged);" \
           "try: sudo $0"

network() {  # network <command> [options]: runtime/emulated_network.py, from the repository
    (cd "$HERE/.." && "$PYTHON" -m runtime.emulated_network "$@")
}
if [ -n "$LINK_RATE" ]; then
    # Checked before anything is made: a bad rate, or no ip/tc, is one line here.
    reason=$(network check --rate "$LINK_RATE" 2>&1) || die "${reason#*error: }"
    NODES=("$SUBNET.1" "$SUBNET.2")
    CONTROLLER=$SUBNET.254
    TAG=ddpns$PORT  # runtime/shaped_links.py's prefix, unique per cluster (its port)
fi

# --- packages: install only what is missing --------------------------------
missing=0
for program in slurmctld slurmd sbatch sinfo munged mungekey runuser; do
    command -v "$program" >/dev/null 2>&1 || missing=1
done
if [ "$missing" -eq 1 ]; then
    command -v apt-get >/dev/null 2>&1 \
        || die "Slurm/munge are not installed and apt-get is not available" \
               "(needs Debian/Ubuntu packages slurmctld slurmd slurm-client munge)"
    say "installing slurmctld slurmd slurm-client munge (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    # The packages' own services may not start (policy-rc.d in containers);
    # that does not matter: the daemons below are started by hand.
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null \
        || die "apt-get install slurmctld slurmd slurm-client munge failed"
fi

# --- already running? ------------------------------------------------------
# A pid file counts only if its process is alive (not a zombie) and is the
# named daemon.
alive() {  # alive <pid file> <program name>
    local pid
    [ -s "$1" ] || return 1
    pid=$(cat "$1")
    [ -r "/proc/$pid/stat" ] && [ "$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f1)" != Z ] \
        && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$2" ]
}
all_alive() {
    alive "$MUNGE_DIR/munged.pid" munged && alive "$DIR/run/slurmctld.pid" slurmctld \
        && alive "$DIR/run/slurmd-${NODES[0]}.pid" slurmd \
        && alive "$DIR/run/slurmd-${NODES[1]}.pid" slurmd \
        && [ "$(cat "$DIR/link-rate" 2>/dev/null)" = "$LINK_RATE" ]
}

last_error() {  # the last error line of a log, to say why a daemon stopped
    grep -hE 'error|fatal' "$1" 2>/dev/null | tail -n 1
}

wait_for_idle_nodes() {
    local deadline=$((SECONDS + 60)) states=""
    while [ "$SECONDS" -lt "$deadline" ]; do
        alive "$DIR/run/slurmctld.pid" slurmctld \
            || die "slurmctld exited: $(last_error "$DIR/log/slurmctld.log")" \
                   "(log: $DIR/log/slurmctld.log)"
        for node in "${NODES[@]}"; do
            alive "$DIR/run/slurmd-$node.pid" slurmd \
                || die "slurmd $node exited: $(last_error "$DIR/log/slurmd-$node.log")" \
                       "(log: $DIR/log/slurmd-$node.log)"
        done
        states=$(SLURM_CONF=$CONF sinfo --noheader --Node --format='%N %t' 2>/dev/null \
                 | sort -u || true)
        if [ "$(grep -c ' idle$' <<<"$states")" -eq "${#NODES[@]}" ]; then
            return 0
        fi
        sleep 1
    done
    die "nodes not idle after 60 s (sinfo said: ${states:-nothing}); see $DIR/log/"
}

if all_alive; then
    say "already running under $DIR"
    wait_for_idle_nodes
    echo "export SLURM_CONF=$CONF"
    exit 0
fi
# Half a cluster (a daemon died, or the machine rebooted): stop the rest and
# start afresh, so there is only ever one.
SLURM_LOCAL_DIR=$DIR "$HERE/stop_local_cluster.sh" >/dev/null

for port in "$PORT" $((PORT + 1)) $((PORT + 2)); do
    # A connection that succeeds means something already listens there.
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        die "port $port is in use (another cluster?);" \
            "choose others with SLURM_LOCAL_PORT=<free port>"
    fi
done

# --- folders ---------------------------------------------------------------
# munged runs as user munge: it must be able to reach its folder, and it
# refuses folders that others can write. 0755 works; 0700 does not.
mkdir -p "$DIR" "$DIR/state" "$DIR/run" "$DIR/log" "$MUNGE_DIR"
for node in "${NODES[@]}"; do mkdir -p "$DIR/spool/$node"; done
chmod 0755 "$DIR" "$DIR/spool" "$DIR"/spool/*
chown munge:munge "$MUNGE_DIR"
chmod 0755 "$MUNGE_DIR"
echo "$LINK_RATE" >"$DIR/link-rate"  # what a second start compares with

# --- the emulated network (--link-rate) ------------------------------------
# Every object is recorded in $DIR/network.record before it is made, so
# stop_local_cluster.sh removes it all, also after a start that failed here.
TASK_PROLOG=""
if [ -n "$LINK_RATE" ]; then
    STARTED=1
    reason=$(network up --tag "$TAG" --hosts 2 --rate "$LINK_RATE" --subnet "$SUBNET" \
             --bridge-address --record "$DIR/network.record" 2>&1) \
        || die "${reason#*error: }"
    # gloo binds to what the host name resolves to, which is not in a node's
    # namespace; without an interface it falls back to 127.0.0.1, which the
    # other node cannot reach. Slurm adds a TaskProlog's "export" lines to
    # every task's environment.
    TASK_PROLOG=$DIR/task-prolog.sh
    printf '#!/bin/sh\necho export GLOO_SOCKET_IFNAME=ddplink0\n' >"$TASK_PROLOG"
    chmod 0755 "$TASK_PROLOG"
fi

# --- munge: own key, own socket --------------------------------------------
if [ ! -s "$MUNGE_DIR/munge.key" ]; then
    mungekey --create --keyfile="$MUNGE_DIR/munge.key"
fi
chown munge:munge "$MUNGE_DIR/munge.key"
chmod 0600 "$MUNGE_DIR/munge.key"
rm -f "$SOCKET" "$SOCKET.lock"
runuser -u munge -- munged --key-file="$MUNGE_DIR/munge.key" --socket="$SOCKET" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" \
    || die "munged did not start (user munge must be able to reach $MUNGE_DIR);" \
           "see $MUNGE_DIR/munged.log"
STARTED=1
munge --socket="$SOCKET" --no-input | unmunge --socket="$SOCKET" >/dev/null \
    || die "munge does not work with socket $SOCKET; see $MUNGE_DIR/munged.log"

# --- slurm.conf ------------------------------------------------------------
cat >"$CONF" <<EOF
# Written by slurm/start_local_cluster.sh: two nodes on one machine.
# Link rate between the nodes: ${LINK_RATE:-not shaped (loopback)}
ClusterName=ddplocal
SlurmctldHost=$(hostname -s)($CONTROLLER)
SlurmctldPort=$PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
# No cgroups in containers: track processes by /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# Impossible requests fail at submission instead of pending forever.
EnforcePartLimits=ALL
# Trust the CPUs= below rather than the hardware, so 2 tasks per node fit.
SlurmdParameters=config_overrides
# Kill the rest of a step quickly once one task has failed.
KillWait=5
${TASK_PROLOG:+TaskProlog=$TASK_PROLOG}
NodeName=${NODES[0]} Port=$((PORT + 1)) CPUs=$CPUS State=UNKNOWN
NodeName=${NODES[1]} Port=$((PORT + 2)) CPUs=$CPUS State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

# --- daemons (-c: start clean, forget jobs of an earlier cluster here) ------
slurmctld -c -f "$CONF" || die "slurmctld did not start; see $DIR/log/slurmctld.log"
for index in 0 1; do
    node=${NODES[$index]}
    inside=()  # with --link-rate, each slurmd (and so its jobs) in its node's namespace
    # nsenter, not `ip netns exec`: that remounts /sys, hiding the /sys/fs/cgroup
    # slurmd looks for.
    [ -n "$LINK_RATE" ] && inside=(nsenter "--net=/run/netns/$TAG-$index")
    "${inside[@]}" slurmd -f "$CONF" -N "$node" \
        || die "slurmd $node did not start; see $DIR/log/slurmd-$node.log"
done

wait_for_idle_nodes
say "cluster up: nodes ${NODES[*]} idle${LINK_RATE:+, links shaped to $LINK_RATE};" \
    "files under $DIR"
echo "export SLURM_CONF=$CONF"
