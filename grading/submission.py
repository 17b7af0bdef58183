"""A submission made ready to grade: copied, with the instructor's tests over it, and fingerprinted.

Its tests/ and grading/ are replaced whole, and pyproject.toml is the instructor's; the hidden
tests, the file naming them, the handout builder and the grader's own tests are not copied (student
code runs in the copy). A symbolic link is refused and named in the report's notes: the judge
reads the submission's files as data. Nothing else needs refusing: student code runs only
in the tests' children (grading/sandbox.py), never in the judge.
"""
import hashlib
import os
import shutil

from grading import profile

# Not the student's work, or too large to copy for each grading: never copied nor fingerprinted.
NOT_SUBMITTED = {".git", "__pycache__", ".venv", "venv", "data", ".pytest_cache", ".ruff_cache",
                 ".ipynb_checkpoints", "node_modules"}
REPLACED = ("tests", "grading")  # the instructor's, whatever the submission holds
NOT_FOR_THE_SANDBOX = (*profile.HIDDEN_TESTS, "grading/hidden.py", "grading/handout",
                       "grading/tests")
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
        at_top = os.path.samefile(directory, submission)
        return left_out | ({*REPLACED, "pyproject.toml"} if at_top else set())

    shutil.copytree(submission, folder, ignore=ignore)
    for name in REPLACED:
        if os.path.lexists(os.path.join(submission, name)):
            notes.append(f"replaced the submission's {name}/ with the instructor's")
        shutil.copytree(os.path.join(instructor, name), os.path.join(folder, name),
                        ignore=not_for_the_sandbox(instructor))
    shutil.copy(os.path.join(instructor, "pyproject.toml"), folder)
    return notes


def not_for_the_sandbox(instructor):
    """copytree's `ignore` for the instructor's tests/ and grading/: what is never submitted, and
    what student code must not read: the hidden tests (their children get them from the judge's
    folder, compiled: grading/sandbox.py), the file that names them, the handout builder and the
    grader's own tests."""
    def ignore(directory, names):
        relative = os.path.relpath(directory, instructor)
        return {name for name in names if name in NOT_SUBMITTED
                or os.path.normpath(os.path.join(relative, name)) in NOT_FOR_THE_SANDBOX}
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
