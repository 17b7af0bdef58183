"""The assignment's rubric: each item, its marks, what the tests check, and what a human must
still read. The one place to edit the marks.

A test says which item it assesses, on the test itself (the closest marker wins):
    @pytest.mark.rubric("core.ring")               a test function
    pytestmark = pytest.mark.rubric("core.timing")  every test of a module
    pytest.param(case, marks=pytest.mark.rubric("core.flat"))   one parametrised case
    @pytest.mark.rubric()                           outside the rubric (as a test with none)
A test of the grading profile without an item, or an item the tests grade that no test names, is
a usage error under --grade-profile (grade.py).

Check the mapping after editing:  python -m pytest --collect-only -q --rubric-tests
"""
from typing import NamedTuple


class Item(NamedTuple):
    """One rubric item, as the grade report shows it."""
    id: str
    title: str
    marks: float
    checks: str  # what the tests assess automatically ("" where a person grades it all)
    needs_human: str  # what a human reader must still judge
    graded_by: str = "tests"  # or "person": no test earns it; the grader reads it
    builds_on: tuple = ()  # the items whose code its tests also run
    main_job: str = ""  # the options of `python mlp_ddp.py` with which the main job runs its code
    main_job_needs: tuple = ()  # the items the main job runs before it reaches this one


# What every run of the main job calls: the MLP, the data's shards, the step's timing record; and
# in modes manual and sharded the start-up broadcast (manual_allreduce.broadcast_parameters).
RUN = ("core.mlp", "core.minibatch", "core.timing")
MANUAL = RUN + ("core.manual_ddp",)
TWO_RANKS = "--world-size 2 --epochs 1"


ITEMS = [
    # The code: 22 marks, one item per piece, each checked without the others.
    Item("core.mlp", "The MLP", 1,
         "The MLP is 784-512-256-128-10 with ReLU and dropout, Glorot-initialised, its hidden "
         "sizes configurable; it fits a small labelled set, and reaches 96% test accuracy on the "
         "real MNIST after one epoch of plain mini-batch training (skipped without the data).",
         "Read runtime/models.py: layers chosen and initialised by the student, not imported.",
         main_job="--mode single --epochs 1", main_job_needs=("core.minibatch", "core.timing")),
    Item("core.minibatch", "Each rank's share of the data", 1,
         "Each rank's shard equals DistributedSampler's; shards are disjoint and cover every full "
         "global batch; set_epoch reshuffles; a step sees the same global batch at any world "
         "size; evaluation slices count every sample once; training through torch's DDP gives "
         "the same parameters at world sizes 1, 2 and 4, with gradient accumulation, and for the "
         "same seed.",
         "Read runtime/data.py: the batch size is per process (--batch-size); the global batch is "
         "batch size x accumulation steps x world size.",
         main_job=f"--mode ddp {TWO_RANKS}", main_job_needs=("core.mlp", "core.timing")),
    Item("core.per_parameter", "Per-parameter all-reduce", 1,
         "average_gradients and PerParameterSync give every rank the parameters of one process "
         "trained on the global batch, after every step, at 1-4 gloo ranks (a frozen and a shared "
         "parameter included), equal to torch's DDP.",
         "Read manual_allreduce.py: average_gradients, at the top, and section 2.",
         main_job=f"--mode manual --sync per-param {TWO_RANKS}", main_job_needs=MANUAL),
    Item("core.flat", "One flat buffer", 1,
         "FlatSync (and the shared-memory strategy built on it) trains exactly as one process "
         "and as torch's DDP, after every step, at 1-4 ranks; one all-reduce of every gradient.",
         "Read manual_allreduce.py, section 3.",
         main_job=f"--mode manual --sync flat {TWO_RANKS}", main_job_needs=MANUAL),
    Item("core.bucketed", "Buckets all-reduced while backward runs", 3,
         "The bucket layout takes parameters in reverse, respects the cap and the small first "
         "bucket; BucketedSync starts its first all-reduce before backward ends, launches the "
         "buckets in the same order on every rank, and trains exactly as one process and DDP.",
         "Read manual_allreduce.py, section 4: why buckets, why in index order.",
         main_job=f"--mode manual --sync bucketed {TWO_RANKS}", main_job_needs=MANUAL),
    Item("core.ring", "A ring all-reduce from messages", 2,
         "ring_all_reduce equals dist.all_reduce for awkward lengths and dtypes at 1-5 ranks, "
         "sending 2(n-1)/n of the buffer to its neighbours only.",
         "Read manual_collectives.py: the reduce-scatter and all-gather phases, readable.",
         main_job=f"--mode manual --sync flat --transport ring {TWO_RANKS}",
         main_job_needs=MANUAL + ("core.flat",)),
    Item("core.compression", "Compressed gradients", 1,
         "The compression layer sums in the wire dtype (float16 or bfloat16) and leaves the "
         "result in the tensor, within the wire's precision of the exact sum.",
         "Read manual_allreduce.py, section 5: what float16 and bfloat16 cost.",
         main_job=f"--mode manual --sync bucketed --compress bf16 {TWO_RANKS}",
         main_job_needs=MANUAL + ("core.bucketed",)),
    Item("core.manual_ddp", "The wrapper: start-up, buffers and no_sync", 2,
         "ManualDDP, with a strategy of the tests' own, starts differently seeded ranks from rank "
         "0's parameters, broadcasts buffers before each forward as DDP does, accumulates "
         "gradients under no_sync() as one step on the larger batch, and handles unused "
         "parameters as DDP does.",
         "Read runtime/manual_ddp.py.",
         main_job=f"--mode manual --sync flat --accum-steps 2 {TWO_RANKS}",
         main_job_needs=RUN + ("core.flat",)),
    Item("core.timing", "The timing of a step", 2,
         "union_length and step_record follow the definitions of runtime/timing.py: phases, "
         "busy, hidden and exposed communication split where the last gradient was accumulated; "
         "results files pass the schema.",
         "Judge whether the timing is honest: what each phase measures, and how communication "
         "hidden behind backward is counted.",
         main_job=f"--mode ddp {TWO_RANKS}", main_job_needs=("core.mlp", "core.minibatch")),
    Item("core.sharding_collectives", "The ring's two halves: reduce-scatter and all-gather", 1,
         "ring_reduce_scatter and ring_all_gather equal dist.reduce_scatter_single and "
         "dist.all_gather_single at 2 to 4 gloo ranks, in float32, float16 and bfloat16, "
         "each sending (n-1)/n of the buffer by point-to-point messages to its right neighbour "
         "only.",
         "Read manual_sharding.py, section 1: the two halves, and how they make the ring "
         "all-reduce of manual_collectives.py.",
         main_job=f"--mode sharded --shard optimizer --transport ring {TWO_RANKS}",
         main_job_needs=MANUAL + ("core.zero",)),
    Item("core.zero", "ZeRO-1 and ZeRO-2: the optimizer state and the gradients sharded", 2,
         "ShardedOptimizer, through the library's collectives, trains as torch's "
         "ZeroRedundancyOptimizer and as one process on the global batch, after every step (a "
         "frozen layer, a tied weight, sizes no world size divides, SGD and AdamW), holding 1/n "
         "of the optimizer state, gathered whole and resumed from; each "
         "step reduce-scatters every gradient element once and all-gathers every parameter once, "
         "through the collectives' layers, and all-reduces nothing; ZeRO-2's reduce-scatters "
         "start while backward runs, and it keeps no full gradient.",
         "Read manual_sharding.py, sections 2 to 4: what each rank keeps, and what ZeRO-2 frees, "
         "and when.",
         builds_on=("core.bucketed",),  # ZeRO-2's buckets are Task 5's layout
         main_job=f"--mode sharded --shard optimizer {TWO_RANKS}", main_job_needs=MANUAL),
    Item("core.fsdp", "ZeRO-3: the parameters sharded too", 3,
         "FullyShardedModel, through the library's collectives, trains as torch's fully_shard and "
         "as one process on the global batch, after every step (the same traps), in float32 and "
         "in 16-bit compute with float32 masters, keeping no whole parameter or gradient between "
         "uses; each step all-gathers every unit twice (forward and backward) and "
         "reduce-scatters its gradients once, with no all-reduce the size of a unit.",
         "Read manual_sharding.py, section 5: when a unit is whole, when it is freed, and what "
         "the prefetch overlaps.",
         main_job=f"--mode sharded --shard parameters {TWO_RANKS}", main_job_needs=MANUAL),
    Item("core.end_to_end", "The main job", 2,
         "Everything together: mlp_ddp.py trains the MLP to 96% (real MNIST), manual mode on two "
         "processes writes results that pass the schema with the timing invariants for every "
         "strategy and DDP; every strategy inside ManualDDP equals DDP on the hard cases "
         "(buffers, unused parameters, no_sync, compression); --mode sharded trains each ZeRO "
         "level as manual mode does, resumes from its checkpoints and records what each rank "
         "holds; ZeRO through the hand-written ring; a real two-node Slurm job matches a local "
         "run (root only).",
         "Nothing more: the other items are read.",
         builds_on=("core.mlp", "core.minibatch", "core.per_parameter", "core.flat",
                    "core.bucketed", "core.ring", "core.compression", "core.manual_ddp",
                    "core.timing", "core.sharding_collectives", "core.zero", "core.fsdp")),
    # The design document: 10 marks. Checked by program: its numbers and derivations (4);
    # read by a person: each section's argument (6).
    Item("design.numbers", "The document's numbers and derivations", 4,
         "The cost model's derivations give the right numbers: the ring's message steps and "
         "bytes per rank at n ranks, the bytes of each bucket at a cap, and the world size from "
         "which a step's all-reduce outlasts its compute. The committed document is exactly what "
         "the build makes from the committed results, and every number traces to a results "
         "file.",
         "Nothing more: each section's prose is read in its own task, by a person.",
         builds_on=("core.mlp",)),
    Item("design.architecture", "Design document: system architecture", 1, "",
         "Read design_doc/1-architecture.md: does each section open with its answer; the "
         "modules, why one training loop serves every mode with the gradient sync passed in, and "
         "where the processes come from.",
         graded_by="person"),
    Item("design.data_flow", "Design document: data flow", 1, "",
         "Read design_doc/2-data-flow.md: answers first; the path of a batch from file to "
         "averaged gradient in each mode, and what each rank holds.", graded_by="person"),
    Item("design.communication", "Design document: communication patterns", 1, "",
         "Read design_doc/3-communication.md: answers first; each strategy's collectives, "
         "message steps and bytes (data linked as CSV), their timing against backward, and what "
         "compression changes.",
         graded_by="person"),
    Item("design.performance", "Design document: performance analysis", 1, "",
         "Read design_doc/4-performance.md: does each section open with its answer, is every "
         "verdict from ratios paired within a round under one stated rule, and are the "
         "measurements explained (compute against communication, exposed against hidden), not "
         "restated?",
         graded_by="person"),
    Item("design.scalability", "Design document: scalability discussion", 1, "",
         "Read design_doc/5-scalability.md: answers first; are the projections argued from the "
         "fitted model, with their assumptions stated?", graded_by="person"),
    Item("design.sharding", "Design document: sharding", 1, "",
         "Read design_doc/7-sharding.md: answers first; memory per rank (at the step and at its "
         "peak) and time per step for DDP, the three ZeRO levels and torch's; the trade, ZeRO-3's "
         "1.5x the bytes for 1/n of the memory; what each transport sends and costs; what "
         "prefetching hides, and how that is measured honestly; where each level wins; the "
         "projection to a model that does not fit one rank.", graded_by="person"),
]
