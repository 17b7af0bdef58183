#!/usr/bin/env bash
# The measurements on emulated links (§5.6), as root, on a quiet machine, in this order:
#
#   sudo OFFLINE_DATA_DIR=DIR ./analysis/make_emulated_results.sh       # about 40 minutes, 2 cores
#   sudo LINK_RATE=10gbit ./analysis/make_emulated_results.sh           # another rate
#
# 1. The all-reduce, gloo's and the ring, 4 KiB..64 MiB on LINK_RATE (1gbit) links, 2 and 4 ranks
#    a node each, and 2 nodes x 2 -> results/emulated/allreduce-1gbit{,-2pn}.json.
# 2. The highest rate at which the link, not the CPU, bounds it -> results/emulated/link-ceiling*.
# 3. Training through SLURM on a local two-node cluster with shaped links: 2 nodes x 1 and x 2,
#    ddp, per-param, flat and bucketed, MLP and CNN, one job at a time (the nodes share 2 cores),
#    3 interleaved repeats -> results/slurm/link-1gbit/. Each rank gets one thread: by default
#    both nodes would take every core and their OpenMP threads fight (65 ms an MLP step, not 13).
# 4. The CNN with 4 MiB buckets, beside flat -> results/slurm/link-1gbit-bucket-4mb/.
# The cluster is stopped and its network removed however the script ends. Then commit
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
