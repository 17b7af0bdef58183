#!/usr/bin/env bash
# Train mlp_ddp.py on 2 nodes x 2 processes under Slurm. From the repository root:
#
#   ./run_slurm.sh --mode ddp --epochs 1                  # makes logs/, then submits itself
#   mkdir -p logs && sbatch run_slurm.sh --mode ddp       # the same, by hand
#   LAUNCH=torchrun ./run_slurm.sh --mode manual --sync flat --epochs 1
#   sbatch --nodes=4 --time=01:00:00 run_slurm.sh --mode ddp   # sbatch options go before the script
#
# sbatch fails the job without a word when the folder of --output is missing,
# hence the self-submitting form: run without Slurm around it, this script
# creates logs/ and hands itself to sbatch from the repository root. Every
# argument goes to mlp_ddp.py; relative paths in them start at that root.
#
# LAUNCH=srun (default): one Slurm task per rank; mlp_ddp.py reads its rank
#   from SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID.
# LAUNCH=torchrun: one Slurm task per node, each running torchrun, which
#   starts --ntasks-per-node ranks and numbers them in the order nodes join.
# Other settings: PYTHON (default python3), MASTER_PORT (default derived from
#   the job id, so two jobs on the same nodes do not collide).
# Output: logs/<job name>-<job id>.out, and where nvidia-smi exists
#   logs/<job name>-<job id>-gpu-<host>.csv (GPU use every 5 s, per node).
#
#SBATCH --job-name=mlp-ddp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --output=logs/%x-%j.out
# On GPU nodes, one GPU per process (remove one '#' to enable):
##SBATCH --gpus-per-node=2
set -uo pipefail

if [ -z "${SLURM_JOB_ID:-}" ]; then
    command -v sbatch >/dev/null 2>&1 \
        || { echo "run_slurm.sh: error: no sbatch here; run it on a Slurm login node" \
                  "(or see slurm/README_SLURM.md)" >&2; exit 2; }
    cd "$(dirname "$0")" && mkdir -p logs && exec sbatch "$(basename "$0")" "$@"
fi

log() { echo "run_slurm.sh: $*"; }
cd "$SLURM_SUBMIT_DIR" || exit 2
[ -f mlp_ddp.py ] \
    || { log "error: no mlp_ddp.py in $SLURM_SUBMIT_DIR; submit from the repository root"; exit 2; }

PYTHON=${PYTHON:-python3}
LAUNCH=${LAUNCH:-srun}
CPUS_PER_TASK=${SLURM_CPUS_PER_TASK:-1}
TASKS_PER_NODE=${SLURM_NTASKS_PER_NODE:-$((SLURM_NTASKS / SLURM_NNODES))}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
# One compute thread per CPU given to each rank, not one per core of the node.
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$CPUS_PER_TASK}
export PYTHON MASTER_ADDR MASTER_PORT OMP_NUM_THREADS
log "job $SLURM_JOB_ID ($SLURM_JOB_NAME): nodes $SLURM_JOB_NODELIST, $TASKS_PER_NODE ranks per" \
    "node, launch=$LAUNCH, master $MASTER_ADDR:$MASTER_PORT, python $(command -v "$PYTHON")"

# GPU use per node, in the background, for as long as the job runs.
monitor_pid=""
if command -v nvidia-smi >/dev/null 2>&1; then
    mkdir -p logs
    # Its own step, sharing the CPUs (--overlap); silenced, because it ends
    # by being cancelled, which srun reports loudly.
    query=timestamp,index,name,utilization.gpu,utilization.memory,memory.used,memory.total
    # the node's name is expanded on each node
    gpu_log="logs/$SLURM_JOB_NAME-$SLURM_JOB_ID-gpu-\${SLURMD_NODENAME:-\$(hostname)}.csv"
    srun --overlap --quiet --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 \
        bash -c "nvidia-smi --query-gpu=$query --format=csv -l 5 > $gpu_log" \
        >/dev/null 2>&1 &
    monitor_pid=$!
fi
# shellcheck disable=SC2317  # called by the trap
stop_monitor() {
    [ -n "$monitor_pid" ] && kill "$monitor_pid" 2>/dev/null && wait "$monitor_pid" 2>/dev/null
}
trap stop_monitor EXIT

# --kill-on-bad-exit: when one rank dies, end the others at once instead of
# leaving them waiting in a collective until --timeout.
case "$LAUNCH" in
    srun)
        step="srun: one task per rank, $PYTHON mlp_ddp.py"
        srun --kill-on-bad-exit=1 --cpus-per-task="$CPUS_PER_TASK" "$PYTHON" mlp_ddp.py "$@"
        ;;
    torchrun)
        # One task per node, given the CPUs of all the node's ranks: without
        # --cpus-per-task it would get 1 CPU (srun 22.05 does not inherit the
        # job's), and where tasks are bound to CPUs every rank would share it.
        step="srun: one torchrun per node, $TASKS_PER_NODE ranks each"
        srun --kill-on-bad-exit=1 --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" \
            --ntasks-per-node=1 --cpus-per-task=$((CPUS_PER_TASK * TASKS_PER_NODE)) \
            "$PYTHON" -m torch.distributed.run --nnodes="$SLURM_NNODES" \
            --nproc-per-node="$TASKS_PER_NODE" --rdzv-backend=c10d \
            --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" --rdzv-id="$SLURM_JOB_ID" \
            mlp_ddp.py "$@"
        ;;
    *)
        log "error: LAUNCH must be srun or torchrun, not '$LAUNCH'"
        exit 2
        ;;
esac
status=$?

if [ "$status" -eq 0 ]; then
    log "job $SLURM_JOB_ID finished: exit status 0"
else
    log "FAILED: job $SLURM_JOB_ID, step '$step' ended with exit status $status" \
        "(a rank exited early or was killed; its own error is above)" >&2
fi
exit "$status"
