"""The grader: the product for instructors, apart from the lesson it grades.

    grade.py (top level)     grade a submission: copy it, run the grading profile, write reports
    make_handout.py          build the student's repository and Gradescope's autograder
    rubric.py, profile.py    what is graded, and which tests grade it within the budget
    plugin.py, report.py     the pytest plugin that marks each test's rubric item, and the report
    judge.py, judge_guard.py the folder pytest runs in, where no task code may run
    sandbox.py, namespace.py where student code runs, as whom, and what it can see
    launch.py                the one way a test starts student code: a command, or N ranks
    recorded_group.py        a gloo group that reports every operation, for the integrity checks
    runner.py, calibration.py the judge's pytest under hard limits; the machine's speed
    handout/                 the handout builder and its templates (instructors only)
    tests/                   the grader's own tests (instructors only)
"""
