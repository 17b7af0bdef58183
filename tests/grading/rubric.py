"""The assignment's rubric and the tests that assess each item: the one place to edit.

ITEMS: each rubric item, its marks, what the tests check, and what a human must still read.
TESTS: ordered rules (pattern, item id, a tuple of ids, or None). The first rule whose pattern
matches a test's node id decides; None means "outside the rubric" (counted for nothing).
A pattern is a case-insensitive glob (fnmatch: * ? [seq]) for the *start* of a node id:
    "tests/test_data.py::test_shards_"       every test of test_data.py whose name starts so
    "tests/test_design_doc.py::*scalab"      any test of that module with "scalab" in its id
A test matched by no rule is named in the run's summary ("in no rubric item"): map it here.
A test can also carry its item itself, which wins over these rules:
    @pytest.mark.rubric("core.distributed")

Check the mapping after editing:  python -m pytest --collect-only -q --rubric-tests
"""
from typing import NamedTuple

from tests.grading.profile import HIDDEN


class Item(NamedTuple):
    """One rubric item, as the grade report shows it."""
    id: str
    title: str
    marks: float
    checks: str  # what the tests assess automatically
    needs_human: str  # what a human reader must still judge


ITEMS = [
    # Core implementation: 10 marks.
    Item("core.mlp", "MLP built from scratch", 2,
         "The MLP trains to at least 96% test accuracy on real MNIST in one epoch on one process; "
         "the training data are normalised float tensors in memory, split into seeded, disjoint "
         "training and validation sets.",
         "Read runtime/models.py: the network is assembled from layers by the student (no "
         "torchvision or pretrained model) with sensible sizes and initialisation. The accuracy "
         "test needs the "
         "real MNIST (OFFLINE_DATA_DIR or ./data) and is skipped without it."),
    Item("core.minibatch", "Mini-batch training", 2,
         "Each rank's shard equals DistributedSampler's; shards are disjoint and cover every full "
         "global batch; set_epoch reshuffles; a step sees the same global batch for any world "
         "size; gradient accumulation equals one step on the larger batch; the same seed gives "
         "identical runs; uneven data drop the last partial global batch; evaluation counts each "
         "sample once.",
         "Read runtime/trainer.py: one loop for every mode; the batch size is per process "
         "(--batch-size), the global batch being batch size x accumulation steps x world size; "
         "the optimiser and learning-rate choices explained."),
    Item("core.distributed", "Distributed training with DDP and with hand-written all-reduce", 4,
         "Every hand-written strategy (per-parameter, flat, bucketed, ring) and DDP equal one "
         "process on the global batch and each other after every step, for 1-4 real gloo "
         "processes, MLP and CNN, with a frozen and a shared parameter; compressed gradients stay "
         "within the wire precision; the ring equals dist.all_reduce; buckets overlap backward in "
         "the same order on every rank; a two-process run completes; a real two-node Slurm job "
         "matches a local run.",
         "Read manual_allreduce.py, manual_collectives.py (the ring) and runtime/manual_ddp.py: "
         "the synchronisation is the student's own and readable, not a call into DDP. The Slurm "
         "tests need root (skipped without it; failed instead when CI is set)."),
    Item("core.timing", "Per-epoch timing and communication-overhead measurement", 2,
         "Results files carry per-epoch compute, exposed and busy communication and data times "
         "and pass the schema; the benchmarks write verified all-reduce and per-step "
         "measurements; the plots break time down into compute, exposed communication and data; "
         "the sweep writes valid results and plots.",
         "Judge whether the timing is honest: what each phase measures, how communication hidden "
         "behind backward is counted, and that the committed results come from real runs on the "
         "stated machine."),
    # Design document: 15 marks, 3 per section.
    Item("design.architecture", "Design document: system architecture", 3,
         "The section (design_doc/1-architecture.md) exists and covers its required topics; its "
         "numbers agree with results/; the plots it cites exist and come from results "
         "(tests/test_design_doc*.py).",
         "Read the section: does it explain the modules, why one training loop serves every mode "
         "with the gradient sync passed in, and where the processes come from (local, torchrun, "
         "Slurm)?"),
    Item("design.data_flow", "Design document: data flow", 3,
         "As for the architecture, for design_doc/2-data-flow.md.",
         "Read the section: is the path of a batch (file, memory, each rank's shard, forward, "
         "backward, averaged gradient, step) right for every mode, including what each rank "
         "holds?"),
    Item("design.communication", "Design document: communication patterns", 3,
         "As for the architecture, for design_doc/3-communication.md.",
         "Read the section: are each strategy's collectives, message steps and bytes, their "
         "timing relative to backward, and what compression changes explained correctly?"),
    Item("design.performance", "Design document: performance analysis", 3,
         "As for the architecture, for design_doc/4-performance.md; and the alpha-beta model "
         "fitted to the all-reduce benchmark is the fit the build reproduces.",
         "Read the section: does it explain the measurements (compute against communication, "
         "exposed against hidden, the bucket size) rather than restate them, and name the limits "
         "of a 2-core machine?"),
    Item("design.scalability", "Design document: scalability discussion", 3,
         "As for the architecture, for design_doc/5-scalability.md; its projections come from the "
         "fitted model.",
         "Read the section: are the projections beyond the measured world sizes argued from the "
         "fitted model, with their assumptions stated, and compared fairly with published "
         "systems?"),
]

DESIGN = tuple(item.id for item in ITEMS if item.id.startswith("design."))
DOC = "tests/test_design_doc.py::"  # the build, its provenance and its errors
CLAIMS = "tests/test_design_doc_claims.py::"  # the document's claims, recomputed
COST = "tests/test_cost_model.py::"  # the cost model behind §4.4 and §5
ANY_DOC = "tests/test_design_doc*::"  # either design-document module

TESTS = [
    # The hidden tests' rules (tests/grading/hidden.py: absent from the student's copy)
    *(HIDDEN.RULES if HIDDEN else ()),
    # MLP built from scratch
    ("tests/test_models.py::", "core.mlp"),
    ("tests/test_cli.py::test_the_mlp_reaches_96_percent", "core.mlp"),
    ("tests/test_data.py::test_splits_are_normalised", "core.mlp"),
    ("tests/test_data.py::test_validation_split_is_seeded", "core.mlp"),
    ("tests/test_data.py::test_subsets_keep_only", "core.mlp"),
    # Mini-batch training
    ("tests/test_data.py::test_shards_", "core.minibatch"),
    ("tests/test_data.py::test_set_epoch", "core.minibatch"),
    ("tests/test_data.py::test_the_global_batch_of_each_step", "core.minibatch"),
    ("tests/test_data.py::test_evaluation_slices", "core.minibatch"),
    ("tests/test_cli.py::test_gradient_accumulation", "core.minibatch"),
    ("tests/test_cli.py::test_a_global_batch_larger_than_the_training_set", "core.minibatch"),
    ("tests/test_reliability.py::test_the_same_seed_gives_identical", "core.minibatch"),
    ("tests/test_reliability.py::test_world_sizes_1_2_and_4_with_the_same_global_batch",
     "core.minibatch"),
    ("tests/test_reliability.py::test_uneven_data_drops_the_last_partial_global_batch",
     "core.minibatch"),
    # Distributed training: DDP and the hand-written all-reduce
    ("tests/test_gradient_sync.py::", "core.distributed"),
    ("tests/test_ring_and_buckets.py::", "core.distributed"),
    ("tests/test_slurm.py::", "core.distributed"),
    ("tests/test_emulated_network.py::", "core.distributed"),
    ("tests/test_cli.py::test_manual_mode_on_two_processes", ("core.distributed", "core.timing")),
    # Timing and communication overhead
    ("tests/test_cli.py::test_the_schema_check", "core.timing"),
    ("tests/test_timing.py::test_tensorboard_without", None),
    ("tests/test_timing.py::", "core.timing"),
    ("tests/test_timing_runs.py::", "core.timing"),
    ("tests/test_benchmarks.py::", "core.timing"),
    ("tests/test_plot", "core.timing"),  # test_plots.py and test_plot_*.py
    ("tests/test_sweep.py::", "core.timing"),
    # Design document. A test of one section's content counts for that section...
    (DOC + "test_bucket_layouts_", "design.communication"),  # 3.2: the bytes of each bucket
    (COST + "test_the_fit_", "design.performance"),  # 4.4: the alpha-beta model
    (CLAIMS + "test_the_build_fit", "design.performance"),
    (COST + "test_overlap_hides_", "design.scalability"),  # 5.2: projected exposed communication
    (COST + "test_communication_dominates_", "design.scalability"),  # 5.3: where it dominates
    (DOC + "test_a_missing_results_file_", None),  # the build's error messages, as for the CLI
    (DOC + "test_the_emulated_links_", "design.scalability"),  # 5.6: the emulated network
    (DOC + "test_the_one_machine_sweep_", "design.performance"),  # 4.7: shared memory
    # 4.3: verdicts only beyond the spreads
    (CLAIMS + "test_a_strategy_is_called_faster_", "design.performance"),
    (CLAIMS + "test_the_verdicts_against_", "design.performance"),
    # 4.2-4.3: derived from the results
    (CLAIMS + "test_efficiency_ceiling_and_overlap_", "design.performance"),
    (CLAIMS + "test_the_appendix_shows_", "design.performance"),  # 6.1: the fit's residuals
    (COST + "test_halving_doubling_", "design.scalability"),  # 5: the tree-like algorithm
    (COST + "test_projections_lay_out_", "design.scalability"),
    (COST + "test_published_figures_", "design.scalability"),  # 5.5: Horovod and DDP
    # ...as does one parametrized by section file ([3-communication.md]); a new test is placed by
    # the first of these keywords in its id...
    (ANY_DOC + "*architecture", "design.architecture"),
    (ANY_DOC + "*data?flow", "design.data_flow"),
    (ANY_DOC + "*communication", "design.communication"),
    (ANY_DOC + "*performance", "design.performance"),
    (ANY_DOC + "*scalab", "design.scalability"),
    (ANY_DOC + "*cost?model", "design.performance"),
    (COST, "design.performance"),
    # ...and whole-document checks count for every section: if they fail, no section's numbers
    # can be trusted. The build reproduces the committed document, --check catches a stale one,
    # every number traces to a field of a results file, no placeholder is left undefined, a
    # missing run reads "not measured", the README's numbers too, and the synthetic results the
    # other checks use are valid.
    (DOC + "test_the_committed_document_", DESIGN),
    (DOC + "test_check_reports_a_stale_document", DESIGN),
    (DOC + "test_the_check_ignores_last_bit_noise", DESIGN),
    (DOC + "test_every_section_exists_", DESIGN),
    (DOC + "test_every_number_traces_", DESIGN),
    (DOC + "test_a_placeholder_", DESIGN),
    (DOC + "test_a_missing_run_", DESIGN),
    (ANY_DOC + "*readme", DESIGN),
    (DOC + "test_the_synthetic_results_", DESIGN),
    (CLAIMS + "test_the_synthetic_steps_", DESIGN),
    (DOC + "test_no_template_types_", DESIGN),
    # Outside the rubric: robustness and plumbing beyond what the assignment asks.
    ("tests/test_reliability.py::", None),
    ("tests/test_shared_memory.py::", None),  # a worked example (manual_collectives.py), no task
    ("tests/test_handout.py::", None),  # the instructor's tools, not the assignment
    ("tests/test_grade.py::", None),
    ("tests/test_grader_security.py::", None),
    ("tests/test_harness.py::", None),  # the tests' own harness
    ("tests/test_cli.py::test_bad_options", None),
    ("tests/test_cli.py::test_missing_data_offline", None),
    ("tests/test_data.py::test_torchvision_imports", None),
    ("tests/test_data.py::test_the_files_read_as", None),
    ("tests/test_data.py::test_a_damaged_extracted_file", None),
    ("tests/test_data.py::test_fashion_mnist", None),
    ("tests/test_data.py::test_an_offline_folder", None),
    ("tests/test_data.py::test_a_corrupt_offline_file", None),
    ("tests/test_data.py::test_the_offline_copy", None),
    ("tests/test_grading.py::", None),
    ("tests/test_time_to_accuracy.py::", None),  # speed to accuracy: beyond the assignment
    ("tests/test_learning_rate_schedule.py::", None),  # its schedule, likewise
]
