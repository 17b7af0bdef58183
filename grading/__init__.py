"""The grader: the product for instructors, apart from the lesson it grades.

    grade.py (top level)      grade a submission: copy it, run the grading profile, write reports
    make_handout.py (top)     build the student's repository and Gradescope's autograder
    rubric.py, profile.py     what is graded, and which tests grade it within the budget
    hidden.py                 which tests are hidden (the autograder's and instructor's alone)
    plugin.py, report.py      the pytest plugin that marks each test's rubric item; the report
    repeats.py                a failure repeated across tests shown once
    gradescope.py             the report as Gradescope's results.json
    submission.py, judge.py   the submission's copy, and the folder pytest runs in
    judge_guard.py            no task code may run in the judge
    runner.py, calibration.py the judge's pytest under hard limits; the machine's speed
    containment.py            each test's deadline, user and folders (a pytest plugin)
    sandbox.py, view.py       where student code runs, as whom, and what it can see
    leftovers.py              what it leaves behind: processes, files, IPC objects, removed
    launch.py                 the one way a test starts student code: a command, or N ranks
    recorded_group.py         a gloo group that reports every operation, for integrity checks
    sockets.py                no new socket for the ranks whose bytes a check counts
    handout/                  the handout builder and its templates (instructors only)
    tests/                    the grader's own tests (instructors only)
"""
