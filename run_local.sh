#!/usr/bin/env bash
# Local runs on one machine, from the repository root:
#
#   ./run_local.sh                  # the main job: MLP on MNIST, 4 processes, all-reduce by hand
#   ./run_local.sh compare [ARGS]   # single, ddp and every manual strategy on 4 processes,
#                                   # 1 epoch each, then the plots
#   ./run_local.sh torchrun [ARGS]  # the same entry point started by torchrun (4 processes)
#   ./run_local.sh sweep [ARGS]     # the scaling sweep and all plots (python -m analysis.sweep)
#
# Extra ARGS go to mlp_ddp.py (or sweep.py), e.g. --model cnn, --offline-data-dir DIR.
# Settings: PYTHON (default python3), WORLD_SIZE for compare/torchrun (default 4).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
WORLD=${WORLD_SIZE:-4}
what=${1:-main}
[ $# -gt 0 ] && shift

case "$what" in
    main)
        exec "$PYTHON" mlp_ddp.py --mode manual --world-size 4 "$@" ;;
    compare)
        "$PYTHON" mlp_ddp.py --mode single --epochs 1 --run-name compare-single "$@"
        "$PYTHON" mlp_ddp.py --mode ddp --world-size "$WORLD" --epochs 1 \
            --run-name "compare-ddp-w$WORLD" "$@"
        for sync in per-param flat bucketed; do
            "$PYTHON" mlp_ddp.py --mode manual --sync "$sync" --world-size "$WORLD" --epochs 1 \
                --run-name "compare-manual-$sync-w$WORLD" "$@"
        done
        "$PYTHON" mlp_ddp.py --mode manual --sync flat --transport ring --world-size "$WORLD" \
            --epochs 1 --run-name "compare-manual-flat-ring-w$WORLD" "$@"
        "$PYTHON" -m analysis.plots ;;
    torchrun)
        exec "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node="$WORLD" \
            mlp_ddp.py "$@" ;;
    sweep)
        exec "$PYTHON" -m analysis.sweep "$@" ;;
    *)
        echo "run_local.sh: error: unknown command '$what' (main, compare, torchrun or sweep)" >&2
        exit 2 ;;
esac
