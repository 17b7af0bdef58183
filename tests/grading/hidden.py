"""The hidden tests: which modules, which of their tests the grading profile runs, and the rubric
items they count for. The autograder's and the instructor's alone: make_handout.py leaves this file,
and the modules, out of the student's copy, so that the student's profile.py and rubric.py name
none of them."""

MODULES = ("tests/test_integrity.py", "tests/test_ddp_parity.py",
           "tests/test_sharding_integrity.py")

INTEGRITY = "tests/test_integrity.py::"
SHARDING = "tests/test_sharding_integrity.py::"
PARITY = "tests/test_ddp_parity.py::"
OWN = "*[[]own"  # ids of ManualDDP with the tests' own strategy: "[own-batchnorm-2]", "[own]"
REFERENCE = "*[[]ddp]"  # torch's DDP alone: the tests' own reference

# Grading-profile patterns (profile.PROFILE): every integrity check (about 20 s, and 10 s for the
# sharding lesson's); the DDP-parity hard cases at 2 and 3 ranks (each strategy of the lesson, and
# ManualDDP with the tests' own: about 45 s); ManualDDP's errors once with buckets and once with
# the tests' own strategy. Left out: the 4-rank cases and the fp16 overflow (the whole job's,
# which other tests check), and the options' names (given code).
PROFILE = (
    INTEGRITY,
    SHARDING,  # three launches of 3 ranks, one per item: about 10 s
    PARITY + "test_every_strategy_equals_ddp_after_every_step*-[23]]",
    PARITY + "test_a_parameter_unused_on_every_rank_",
    PARITY + "test_an_unused_parameter_without_find_unused_parameters_is_an_error_naming_it?"
             "bucketed]",
    PARITY + "test_an_unused_parameter_without_find_unused_parameters_is_an_error_naming_it?own]",
    PARITY + "test_ranks_ready_in_different_orders_",
    PARITY + "test_a_gradient_reported_twice_",
)

# Left out of the profile (profile.LEFT_OUT): torch's DDP alone, the tests' own reference.
LEFT_OUT = (PARITY + REFERENCE,)

# Rubric rules (rubric.TESTS), checked before the public ones; the first match decides. Each
# item's tests run its own pieces of the lesson only: a strategy driven alone, one function called
# by the test, or ManualDDP with the tests' own strategy. A strategy of the lesson inside ManualDDP
# needs two items: the whole job's.
RULES = (
    # what each strategy claims to send, and that every all-reduce goes through its layers
    (INTEGRITY + "*[[]per-param]", "core.per_parameter"),
    (INTEGRITY + "test_average_gradients_", "core.per_parameter"),
    (INTEGRITY + "*[[]flat]", "core.flat"),
    (INTEGRITY + "*[[]bucketed]", "core.bucketed"),
    (INTEGRITY + "test_bucketed_", "core.bucketed"),
    (INTEGRITY + "test_the_ring_", "core.ring"),  # manual_collectives.ring_all_reduce alone
    (INTEGRITY + "test_compression_", "core.compression"),  # the layer alone
    # the sharding lesson's pieces, each item in a launch of its own, with the library's
    # collectives: ZeRO's and FSDP's checks need none of the student's ring
    (SHARDING + "test_each_half_of_the_ring_", "core.sharding_collectives"),
    (SHARDING + "test_zero_", "core.zero"),
    (SHARDING + "test_fsdp_", "core.fsdp"),
    # ManualDDP's own work, with the tests' own strategy; torch's DDP alone is the reference
    (PARITY + OWN, "core.manual_ddp"),
    (PARITY + REFERENCE, None),
    (PARITY + "test_a_gradient_reported_twice_", "core.manual_ddp"),
    (PARITY + "test_ranks_ready_in_different_orders_", "core.bucketed"),  # bucketed alone
    # the lesson's strategies (and compression) inside ManualDDP, and fp16 overflowing on the wire
    (PARITY + "test_every_strategy_equals_ddp_", "core.end_to_end"),
    (PARITY + "test_a_parameter_unused_on_every_rank_", "core.end_to_end"),
    (PARITY + "test_an_unused_parameter_without_find_unused_", "core.end_to_end"),
    (PARITY + "test_an_fp16_overflow_", "core.end_to_end"),
    # the runtime's option names against the lesson's constants: given code, which no task writes
    (PARITY + "test_the_options_name_the_lessons_", None),
)
