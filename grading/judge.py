"""The judge's folder: the instructor's code, with the task modules as the handout has them.

grade.py runs pytest here, with GRADE_SANDBOX naming the submission's copy; nothing of the
submission is on this process's path. The task modules (profile.TASK_FILES) are as the student
received them, each solution region a `raise NotImplementedError`, so a test that calls a task's
code in-process fails instead of testing the instructor's solution (judge_guard.py makes the code
around the regions raise too). Student code runs only in the children the tests start.
"""
import os
import shutil

from grading import profile
from grading.submission import NOT_SUBMITTED

# Student data the judge reads from the sandbox, never from its own folder.
NOT_IN_THE_JUDGE = NOT_SUBMITTED | {"results", "design_doc", "handout", ".git", ".ci"}


def make_judge(instructor, folder):
    """Copy the instructor's Python code, tests/ and pyproject.toml to `folder`, without data, and
    with each task module's solution regions replaced by their prompts."""
    def ignore(directory, names):
        relative = os.path.relpath(directory, instructor)
        return {name for name in names if name in NOT_IN_THE_JUDGE or (
            os.path.isfile(os.path.join(directory, name)) and not name.endswith(".py")
            and os.path.normpath(os.path.join(relative, name)) != "pyproject.toml")}

    shutil.copytree(instructor, folder, ignore=ignore, symlinks=True)
    for path in profile.TASK_FILES:
        if not os.path.isfile(os.path.join(folder, path)):
            continue  # not part of this assignment (grading/tests/tiny_assignment.py's)
        with open(os.path.join(folder, path)) as file:
            text = file.read()
        with open(os.path.join(folder, path), "w") as file:
            file.write(as_handed_out(instructor, path, text))


def as_handed_out(instructor, path, text):
    """The student's version of a task module. The autograder's copies are that already; in the
    solution's checkout, grading/handout/regions.py (an instructor's tool) replaces the regions."""
    if not os.path.isdir(os.path.join(instructor, "grading", "handout")):
        return text
    from grading import rubric
    from grading.handout import regions
    titles = [item.title for item in rubric.ITEMS]
    return regions.replace_regions(text, regions.find_regions(path, text, len(titles)), titles)
