"""The hidden tests: which modules, and which of their tests the grading profile runs (their rubric
items are markers in the modules themselves). The autograder's and the instructor's alone:
make_handout.py leaves this file, and the modules, out of the student's copy, so that the
student's profile.py names none of them."""

MODULES = ("tests/test_integrity.py", "tests/test_ddp_parity.py",
           "tests/test_sharding_integrity.py")

INTEGRITY = "tests/test_integrity.py::"
SHARDING = "tests/test_sharding_integrity.py::"
PARITY = "tests/test_ddp_parity.py::"
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
