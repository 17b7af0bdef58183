"""The hidden tests: which modules, which of their tests the grading profile runs, and the rubric
items they count for. The autograder's and the instructor's alone: make_handout.py leaves this file,
and the modules, out of the student's copy, so that the student's profile.py and rubric.py name
none of them."""

MODULES = ("tests/test_integrity.py", "tests/test_ddp_parity.py")

# Grading-profile patterns (profile.PROFILE): the DDP-parity hard cases at 2 and 3 ranks,
# ManualDDP's errors once with buckets, and every integrity check.
PROFILE = (
    "tests/test_ddp_parity.py::test_every_strategy_equals_ddp_after_every_step*-[23]]",
    "tests/test_ddp_parity.py::test_a_parameter_unused_on_every_rank_",
    "tests/test_ddp_parity.py::test_an_unused_parameter_without_find_unused_parameters_"
    "is_an_error_naming_it?bucketed]",
    "tests/test_ddp_parity.py::test_ranks_ready_in_different_orders_",
    "tests/test_ddp_parity.py::test_a_gradient_reported_twice_",
    "tests/test_ddp_parity.py::test_the_options_name_the_lessons_",
    "tests/test_integrity.py::",
)

# Rubric rules (rubric.TESTS), checked before the public ones.
RULES = (
    ("tests/test_ddp_parity.py::", "core.distributed"),
    ("tests/test_integrity.py::", "core.distributed"),
)
