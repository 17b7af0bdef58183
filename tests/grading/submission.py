"""A submission made ready to grade: copied, with the instructor's tests over it, and fingerprinted.

The tests that grade are the instructor's, whatever the submission holds: its tests/ folder is
replaced whole (a deleted or edited test file changes nothing), pyproject.toml (pytest's
configuration) is the instructor's, and what would let a submission reconfigure pytest from its
top folder is removed: a conftest.py, another pytest configuration file, a module that would
shadow pytest itself. Code a student writes still runs inside the tests' processes; what needs a
human reader (the report's needs_human) remains the backstop against code written to fool them.
"""
import hashlib
import os
import shutil

# Not the student's work, or too large to copy for each grading: never copied nor fingerprinted.
NOT_SUBMITTED = {".git", "__pycache__", ".venv", "venv", "data", ".pytest_cache", ".ruff_cache",
                 ".ipynb_checkpoints", "node_modules"}
# At the top of a submission these would reconfigure pytest or replace it.
PYTEST_OVERRIDES = ("conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "__init__.py",
                    "pytest.py", "_pytest", "pluggy", "py.py")
INSTRUCTOR_FILES = ("pyproject.toml",)


def copy_submission(submission, instructor, folder):
    """Copy `submission` to `folder` and put the instructor's tests over it; returns what was
    replaced or removed, one line each."""
    ignore = shutil.ignore_patterns(*NOT_SUBMITTED)
    shutil.copytree(submission, folder, symlinks=True, ignore=ignore)
    notes = []
    for name in PYTEST_OVERRIDES:
        path = os.path.join(folder, name)
        if os.path.lexists(path):
            remove(path)
            notes.append(f"removed the submission's {name}: pytest runs as the instructor "
                         "configured it")
    tests = os.path.join(folder, "tests")
    if os.path.lexists(tests):
        remove(tests)
        notes.append("replaced the submission's tests/ with the instructor's")
    shutil.copytree(os.path.join(instructor, "tests"), tests, ignore=ignore)
    for name in INSTRUCTOR_FILES:
        target = os.path.join(folder, name)
        if os.path.lexists(target):
            remove(target)
        shutil.copy(os.path.join(instructor, name), target)
    return notes


def remove(path):
    """Remove a file, a link or a folder."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


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
