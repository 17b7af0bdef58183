#!/usr/bin/env bash
# Regenerates every reference figure in results/ and every number of design_doc/, in this order:
#
#   ./analysis/make_reference_results.sh                               # about 4 hours on 2 cores
#   OFFLINE_DATA_DIR=DIR ./analysis/make_reference_results.sh          # MNIST from DIR/MNIST/raw
#
# Run it on a quiet machine: the figures are timings. Then commit results/ and design_doc/.
# The emulated network's figures (§5.6) need root: ./analysis/make_emulated_results.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

"$PYTHON" -m analysis.sweep  # results/sweep-*-r*.json, bucket-*-r*.json, sweep-order.json (6 rounds)
# The benchmarks: time to accuracy (§4.6), the all-reduce, the training step, sharding (§7)
"$PYTHON" -m benchmarks.time_to_accuracy  # results/time-to-accuracy.json, about 90 minutes
"$PYTHON" -m benchmarks.allreduce_bench  # results/allreduce-bench.json
"$PYTHON" -m benchmarks.step_bench  # results/step-bench.json
"$PYTHON" -m benchmarks.sharding_bench  # results/sharding.json (§7), about 25 minutes
"$PYTHON" -m benchmarks.dataloader_bench  # results/dataloader-bench.json
"$PYTHON" -m benchmarks.ddp_buckets  # results/ddp-buckets.json: the buckets DDP really sends
# The README's main job, and timelines of bucketed sync and of DDP, out of the sweep's plots
"$PYTHON" mlp_ddp.py --mode manual --world-size 4 \
    --results-dir results/main --run-name mlp-manual-bucketed-w4
for seed in 1 2 3 4; do  # the main job's accuracy over seeds (§4.4)
    "$PYTHON" mlp_ddp.py --mode manual --world-size 4 --seed "$seed" \
        --results-dir results/main-seeds --run-name "mlp-manual-bucketed-w4-seed$seed"
done
for level in optimizer gradients parameters; do  # the main job under each sharding level (§7.2)
    "$PYTHON" mlp_ddp.py --mode sharded --shard "$level" --world-size 4 \
        --results-dir results/main-sharded --run-name "mlp-sharded-$level-w4"
done
"$PYTHON" mlp_ddp.py --mode manual --sync bucketed --world-size 2 --epochs 1 --max-steps 40 \
    --trace-steps 10 \
    --results-dir results/main --run-name trace-bucketed-w2 --trace results/trace-bucketed-w2.json
"$PYTHON" mlp_ddp.py --mode ddp --world-size 2 --epochs 1 --max-steps 40 --trace-steps 10 \
    --results-dir results/main --run-name trace-ddp-w2 --trace results/trace-ddp-w2.json
# When each gradient is ready within backward, per model (the projections' readiness, §5)
for model in mlp cnn; do
    "$PYTHON" mlp_ddp.py --mode single --model "$model" --epochs 1 --max-steps 40 \
        --trace-steps 30 --results-dir results/main --run-name "backward-$model" \
        --trace "results/backward-$model.json"
done
"$PYTHON" -m analysis.plots  # results/plots/*.png
"$PYTHON" -m analysis.build_design_doc  # design_doc/*.md, design_doc/numbers.json
