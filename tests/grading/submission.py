"""A submission made ready to grade: copied, with the instructor's tests over it, and fingerprinted.

Its tests/ is replaced whole, and pyproject.toml is the instructor's; the hidden tests are not
copied (student code runs in the copy). A symbolic link is refused and named in the report's notes:
the judge reads the submission's files as data. Nothing else needs refusing: student code runs only
in the tests' children (tests/grading/sandbox.py), never in the judge.
"""
import hashlib
import os
import shutil

from tests.grading import profile

# Not the student's work, or too large to copy for each grading: never copied nor fingerprinted.
NOT_SUBMITTED = {".git", "__pycache__", ".venv", "venv", "data", ".pytest_cache", ".ruff_cache",
                 ".ipynb_checkpoints", "node_modules"}
REPLACED = {"tests", "pyproject.toml"}  # the instructor's, whatever the submission holds
LINK = "a symbolic link (it could point at the grader's files): submit the file itself"


def copy_submission(submission, instructor, folder):
    """Copy `submission` to `folder` without what is refused, and put the instructor's tests and
    pytest configuration over it; returns what was refused or replaced, one line each."""
    notes = []

    def ignore(directory, names):
        left_out = {name for name in names if name in NOT_SUBMITTED}
        for name in sorted(set(names) - left_out):
            if os.path.islink(os.path.join(directory, name)):
                relative = os.path.relpath(os.path.join(directory, name), submission)
                notes.append(f"refused {relative}: {LINK}")
                left_out.add(name)
        return left_out | (REPLACED if os.path.samefile(directory, submission) else set())

    shutil.copytree(submission, folder, ignore=ignore)
    if os.path.lexists(os.path.join(submission, "tests")):
        notes.append("replaced the submission's tests/ with the instructor's")
    shutil.copytree(os.path.join(instructor, "tests"), os.path.join(folder, "tests"),
                    ignore=not_for_the_sandbox(instructor))
    shutil.copy(os.path.join(instructor, "pyproject.toml"), folder)
    return notes


def not_for_the_sandbox(instructor):
    """copytree's `ignore` for the instructor's tests/: what is never submitted, and the hidden
    tests, which student code must not read (their children get them from the judge's folder,
    compiled: tests/grading/sandbox.py)."""
    def ignore(directory, names):
        relative = os.path.relpath(directory, instructor)
        return {name for name in names if name in NOT_SUBMITTED
                or os.path.normpath(os.path.join(relative, name)) in profile.HIDDEN_TESTS}
    return ignore


def file_hashes(submission):
    """The SHA-256 of every submitted file, by path relative to `submission`, in sorted order;
    a link is fingerprinted by where it points."""
    hashes = {}
    for folder, subfolders, files in os.walk(submission):
        subfolders[:] = sorted(name for name in subfolders if name not in NOT_SUBMITTED)
        for name in sorted(set(files) - NOT_SUBMITTED):  # a worktree's .git is a file
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, submission)
            if os.path.islink(path):
                target = os.readlink(path).encode()
                hashes[relative] = "link:" + hashlib.sha256(target).hexdigest()
            elif os.path.isfile(path):
                hashes[relative] = sha256_of(path)
    return dict(sorted(hashes.items()))


def sha256_of(path):
    """A file's SHA-256, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
