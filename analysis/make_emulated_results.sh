#!/usr/bin/env bash
# The measurements on emulated links (issue 15), as root, on a quiet machine, in this order:
#
#   sudo OFFLINE_DATA_DIR=DIR ./analysis/make_emulated_results.sh       # about 40 minutes, 2 cores
#   sudo LINK_RATE=10gbit ./analysis/make_emulated_results.sh           # another rate
#
# 1. The all-reduce, gloo and the hand-written ring, 4 KiB..64 MiB, on LINK_RATE (1gbit) links:
#    2 and 4 ranks each on a node of its own -> results/emulated/allreduce-1gbit.json;
#    4 ranks as 2 nodes x 2 (a node's ranks share its loopback) -> allreduce-1gbit-2pn.json.
# 2. The highest rate at which the link, not the CPU, bounds the all-reduce: 16 MiB at 2 ranks
#    on 1, 2, 5, 10gbit and unshaped -> results/emulated/ceiling/*.json, link-ceiling.json.
# 3. Training through SLURM on a local two-node cluster whose links are shaped to LINK_RATE
#    (slurm/start_local_cluster.sh --link-rate): 2 nodes x 1 and 2 nodes x 2 ranks, ddp and the
#    per-param, flat and bucketed strategies, MLP (200 steps) and CNN (60 steps), one job at a
#    time (--exclusive: the nodes share 2 cores), 3 interleaved repeats
#    -> results/slurm/link-1gbit/*-r[123].json and plots/.
# Both emulated nodes share this machine's cores, so every rank gets one thread (--threads 1):
# the default, cores / ranks of the node, would give each node all the cores, and the two nodes'
# OpenMP threads would then fight over them (measured: 65 ms of compute per MLP step, not 13).
# 4. The CNN with 4 MiB buckets, beside flat: results/slurm/link-1gbit-bucket-4mb/.
# The cluster is stopped, and its network removed, however the script ends. Then commit
# results/emulated/ and results/slurm/.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
RATE=${LINK_RATE:-1gbit}
export PYTHON  # the cluster's jobs and start_local_cluster.sh use it too

# 1, 2: the all-reduce
"$PYTHON" -m benchmarks.allreduce_bench --world-sizes 2,4 --iterations 10 --emulate-link "$RATE"
"$PYTHON" -m benchmarks.allreduce_bench --world-sizes 4 --ranks-per-node 2 --iterations 10 \
    --emulate-link "$RATE"
"$PYTHON" -m benchmarks.link_ceiling

# 3: training through SLURM on shaped links
RESULTS=results/slurm/link-$RATE
bash slurm/start_local_cluster.sh --link-rate "$RATE" >/dev/null
trap 'bash slurm/stop_local_cluster.sh' EXIT
export SLURM_CONF=${SLURM_LOCAL_DIR:-/tmp/ddp-local-slurm}/slurm.conf
# sbatch --exclusive: one job at a time, so that no job times another one's work
export SBATCH_EXCLUSIVE=exclusive
for model_steps in mlp:200 cnn:60; do
    "$PYTHON" -m slurm.submit_sweep --nodes 2 --tasks-per-node 1,2 \
        --strategies per-param,flat,bucketed --model "${model_steps%:*}" --repeats 3 \
        --results-dir "$RESULTS" --limit 3600 -- --epochs 1 --max-steps "${model_steps#*:}" \
        --threads 1
done
# 4: the CNN's 4.7 MB fc1 gradient shares the 25 MiB default bucket with both convolutions, so it
#    is sent only when backward ends; with 4 MiB buckets it goes alone, as soon as it is ready.
#    flat, bucketed and ddp at 2 nodes x 1, interleaved -> results/slurm/link-1gbit-bucket-4mb/
"$PYTHON" -m slurm.submit_sweep --nodes 2 --tasks-per-node 1 --strategies flat,bucketed \
    --model cnn --repeats 3 --results-dir "$RESULTS-bucket-4mb" --limit 3600 \
    -- --epochs 1 --max-steps 60 --threads 1 --bucket-mb 4
