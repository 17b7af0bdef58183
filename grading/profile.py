"""What grade.py runs: the grading profile, each test's timeout, and which tests are hidden.

HIDDEN_TESTS exist only in the autograder; their names and patterns are in grading/hidden.py,
itself hidden, so the student's copy of this file names none of them. PROFILE: the rubric's tests
that grade a submission within BUDGET_S on 2 cores (GRADING.md, "The profile"), every item keeping
tests that need only its own code. A pattern is a case-insensitive glob for the start of a node
id; LEFT_OUT wins over PROFILE.
"""
import fnmatch
import importlib.util
import os


def hidden_tests():
    """grading/hidden.py beside this file, loaded from it; None in the student's copy."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hidden.py")
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location("hidden_tests_of_the_profile", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HIDDEN = hidden_tests()
HIDDEN_TESTS = HIDDEN.MODULES if HIDDEN else ()

# The assignment's task modules: the files holding solution regions (grading/tests/test_handout.py
# checks this against the markers). The judge's folder never holds them (grading/judge.py).
TASK_FILES = ("analysis/cost_model.py", "manual_allreduce.py", "manual_collectives.py",
              "manual_sharding.py", "runtime/data.py", "runtime/manual_ddp.py", "runtime/models.py",
              "runtime/timing.py")

BUDGET_S = 300  # the whole run: a Gradescope machine gives 10 minutes by default
# One test, set-up and teardown included: twice the slowest seen on a busy machine, and below the
# tests' own 120 s collective timeout, so that a hang costs a minute, not two, of the budget.
DEFAULT_TIMEOUT_S = 60

AT_4 = "*-4]"  # the matrix's ids end in the world size: "[cnn-manual-flat-ring-4]"
SHARDING = "tests/test_sharding.py::"

PROFILE = (
    # core.mlp
    "tests/test_models.py::",  # its 96% test skipped without the real MNIST
    "tests/test_data.py::test_splits_are_normalised",
    "tests/test_data.py::test_validation_split_is_seeded",
    "tests/test_data.py::test_subsets_keep_only",
    # core.minibatch
    "tests/test_data.py::test_shards_",
    "tests/test_data.py::test_set_epoch",
    "tests/test_data.py::test_the_global_batch_of_each_step",
    "tests/test_data.py::test_evaluation_slices",
    "tests/test_cli.py::test_gradient_accumulation_equals_one_step_on_the_larger_batch",
    "tests/test_reliability.py::test_uneven_data_drops_the_last_partial_global_batch",
    # each strategy against one process and DDP at 4 ranks (MLP, CNN, frozen and shared traps;
    # the hard cases at 2 and 3 ranks are hidden), its ranks against rank 0; the ring alone at 3
    # and 5 ranks; the buckets' order and overlap
    "tests/test_gradient_sync.py::test_every_step_equals_one_process_on_the_global_batch" + AT_4,
    "tests/test_gradient_sync.py::test_every_step_equals_torch_ddp" + AT_4,
    "tests/test_gradient_sync.py::test_every_rank_holds_rank_0s_parameters_" + AT_4,
    "tests/test_gradient_sync.py::test_average_gradients_",
    "tests/test_ring_and_buckets.py::test_ring_all_reduce_equals_dist_all_reduce_for_awkward_"
    "lengths_and_dtypes?[35]]",
    "tests/test_ring_and_buckets.py::test_buckets_",
    "tests/test_ring_and_buckets.py::test_bucketed_",
    # core.compression and core.manual_ddp: the layer alone, the wrapper with the tests' strategy
    "tests/test_compression.py::",
    "tests/test_gradient_sync.py::test_manual_ddp_starts_",
    "tests/test_manual_ddp.py::",
    # core.timing: the definitions
    "tests/test_timing.py::",
    # core.sharding_collectives, core.zero and core.fsdp: every check of tests/test_sharding.py at
    # 3 ranks, one launch (the halves, each level with SGD and AdamW, 16-bit compute, the state
    # gathered whole and resumed); 2 and 4 ranks repeat them
    SHARDING + "*-3]",
    SHARDING + "*[[]3]",
    SHARDING + "test_sharded_optimizer_refuses_",
    # core.end_to_end: the main job to 96% (real MNIST), manual mode on two processes, every
    # strategy's timing invariants at 2 and 4 ranks and compressed at 4, the benchmarks, the
    # sweep's plan and failures. Left out: DDP's measured run, the straggler, the compute
    # baseline, a results file's per-rank means, the trace, the sweep's tiny real run (a minute
    # and a half of runs) and the Slurm cluster (root, a minute).
    "tests/test_cli.py::test_the_mlp_reaches_96_percent",
    "tests/test_cli.py::test_manual_mode_on_two_processes",
    "tests/test_cli.py::test_the_schema_check",
    "tests/test_gradient_sync.py::test_compressed_gradients_" + AT_4,
    "tests/test_timing_runs.py::test_busy_hidden_and_exposed_",
    "tests/test_timing_runs.py::test_a_single_process_reports_no_communication",
    "tests/test_benchmarks.py::test_allreduce_benchmark_",
    "tests/test_benchmarks.py::test_step_benchmark_",
    "tests/test_sweep.py::test_the_sweep_exits_",
    "tests/test_sweep.py::test_dry_run_",
    "tests/test_sweep.py::test_bucket_runs_",
    "tests/test_sweep.py::test_a_failed_run_",
    # --mode sharded: ZeRO-3 against --mode manual (two runs, 15 s). Left out: the other levels,
    # 16-bit compute, the resumed runs and what each rank holds (a minute and a half of runs;
    # tests/test_sharding.py checks each level at 3 ranks), and the sharding benchmark (10 s).
    "tests/test_cli_sharding.py::test_each_level_trains_*[[]parameters]",
    # design.numbers: the committed results files, every test of the design document, the cost
    # model and the plots
    "tests/test_timing_runs.py::test_every_committed_results_file_",
    "tests/test_design_doc.py::",
    "tests/test_design_doc_claims.py::",
    "tests/test_cost_model.py::",
    "tests/test_plot",
) + (HIDDEN.PROFILE if HIDDEN else ())

# Within the patterns above, left out: tests outside the rubric, and a graded one that is slow.
LEFT_OUT = (
    "tests/test_timing.py::test_tensorboard_without",
    "tests/test_timing.py::test_the_trace_has_one_track_per_rank",  # graded, but 10 s of runs
    "tests/test_models.py::test_the_cnn_",  # given code
    "tests/test_gradient_sync.py::*-ddp-",  # torch's DDP against one process: the tests' reference
    SHARDING + "*[[]ZeroRedundancyOptimizer-",  # torch's ZeRO and FSDP, likewise
    SHARDING + "*[[]fully_shard-",
    "tests/test_design_doc.py::test_a_missing_results_file_",
) + (HIDDEN.LEFT_OUT if HIDDEN else ())

# Tests known to take longer than DEFAULT_TIMEOUT_S on a busy machine, with their timeouts (s).
TIMEOUTS = (
    ("tests/test_cli.py::test_the_mlp_reaches_96_percent", 240),  # one epoch: 20-60 s
    ("tests/test_models.py::test_the_mlp_reaches_96_percent", 120),  # one epoch: 5-20 s
)


def matches(nodeid, pattern):
    """Whether `pattern` matches the start of `nodeid` (case-insensitive)."""
    return fnmatch.fnmatchcase(nodeid.lower(), pattern.lower() + "*")


def in_profile(nodeid):
    """Whether the grading profile runs this test."""
    if any(matches(nodeid, pattern) for pattern in LEFT_OUT):
        return False
    return any(matches(nodeid, pattern) for pattern in PROFILE)


def timeout_for(nodeid, default):
    """The test's timeout: its own where TIMEOUTS names it, else `default`."""
    for pattern, seconds in TIMEOUTS:
        if matches(nodeid, pattern):
            return max(seconds, default)
    return default


def collects(path):
    """Whether the module at `path` (relative to the repository) holds tests of the profile:
    the others are not even imported, so that one that cannot be imported does not count."""
    return any(matches(path, pattern.split("::")[0]) for pattern in PROFILE)


def is_hidden(nodeid):
    """Whether the test exists only in the autograder."""
    return any(nodeid.startswith(module) for module in HIDDEN_TESTS)
