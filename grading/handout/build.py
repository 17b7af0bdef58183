"""The handout, from the solution's git checkout: the student's repository and the autograder.

The student's copy is every tracked file but the instructor's, the hidden tests, the generated
design document and results/, with each solution region replaced by its prompt (regions.py), and
its own ASSIGNMENT.md, README.md and GRADING.md. The autograder holds Gradescope's two scripts,
grade.py, every test and the student's Python modules, which the judge imports
(grading/judge.py). All is made in memory first, so a marker error writes nothing.
"""
import importlib.util
import os
import re
import shutil
import subprocess
import zipfile
from typing import NamedTuple

from grading.handout import assignment, regions, student_docs
from grading.plugin import items_named_in

HERE = os.path.dirname(os.path.abspath(__file__))
# The instructor's tools and their tests: in neither the student's copy nor the autograder.
INSTRUCTOR_ONLY = ("make_handout.py", "grade.py", "grading/handout/", "grading/tests/",
                   ".ci/",  # the solution's CI builds and grades the handout: not the student's
                   # a working variant of the ring's exchange, which Task 3 asks for
                   "benchmarks/ring_variants/")
AUTOGRADER_SCRIPTS = ("setup.sh", "run_autograder")  # in handout/, copied as they are
GRADING_FILES = ("requirements.txt", "pyproject.toml")
RESULTS_README = ("Your runs write their results files here: see ASSIGNMENT.md, "
                  "\"The design document\".\n")
OUTPUTS = ("student", "autograder", "autograder.zip")
# The student's pytest options: short tracebacks, so that a failure's message is within its first
# lines; no list of the slowest tests (the solution's --durations), which buried the marks.
STUDENT_ADDOPTS = 'addopts = "-ra --tb=short"'
ADDOPTS = re.compile(r"^(?:#.*\n)*addopts = .*$", re.MULTILINE)  # with the comment on it


class BuildError(Exception):
    """A handout that cannot be built; the message says why, in one line."""


class File(NamedTuple):
    """One file of the output: its contents and whether it is executable."""
    data: bytes
    executable: bool = False


class Handout(NamedTuple):
    """The whole output, in memory: {relative path: File} per folder, and the regions replaced."""
    student: dict
    autograder: dict
    regions: list


def load_module(repo, relative):
    """The module at `relative` in `repo`, loaded from its file (the rubric and the profile)."""
    path = os.path.join(repo, relative)
    if not os.path.isfile(path):
        raise BuildError(f"{path} not found: the handout is built from the solution's checkout")
    spec = importlib.util.spec_from_file_location(relative.replace("/", "_")[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tracked_files(repo):
    """The files git tracks in `repo` that are present, as paths relative to it."""
    try:
        listed = subprocess.run(["git", "-C", repo, "ls-files", "-z"], capture_output=True,
                                check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        raise BuildError(f"{repo} is not a git checkout: the handout is made of its tracked "
                         "files") from None
    return sorted(path for path in listed.split("\0")
                  if path and os.path.isfile(os.path.join(repo, path)))


def is_instructors(path, excluded):
    """Whether `path` is one of `excluded`: a file, or a folder given with a trailing slash."""
    return any(path == name or (name.endswith("/") and path.startswith(name))
               for name in excluded)


def is_generated(path):
    """The design document a build writes (its pages, data tables and numbers), and the results it
    is built from."""
    folder, name = os.path.split(path)
    built = folder == "design_doc" and (name.endswith((".md", ".csv")) or name == "numbers.json")
    return built or path.startswith("results/")


def read(repo, path):
    """The File at `path` in `repo`, keeping its executable bit."""
    full = os.path.join(repo, path)
    with open(full, "rb") as file:
        return File(file.read(), os.access(full, os.X_OK))


def student_pyproject(file):
    """pyproject.toml with the student's pytest options in place of the solution's."""
    text, count = ADDOPTS.subn(STUDENT_ADDOPTS, file.data.decode())
    if count != 1:
        raise BuildError("pyproject.toml must have one line 'addopts = ...' (pytest's options), "
                         f"not {count}: the student's copy replaces it")
    return File(text.encode(), file.executable)


def student_copy(path, file, titles, hints=regions.DEFAULT_HINTS):
    """The student's version of one file, with its prompts at hint level `hints`, and the regions
    replaced in it."""
    if path == "pyproject.toml":
        return student_pyproject(file), []
    if not path.endswith((".py", ".md")):
        try:
            error = regions.stray_marker(path, file.data.decode())
        except UnicodeDecodeError:  # a binary file holds no markers
            return file, []
        if error:
            raise error
        return file, []
    text = file.data.decode()
    found = regions.find_regions(path, text, len(titles))
    if not found:
        return file, []
    replaced = regions.replace_regions(text, found, titles, hints)
    if path.endswith(".py"):
        try:
            compile(replaced, path, "exec")
        except SyntaxError as error:
            raise regions.MarkerError(path, error.lineno, "the student's copy does not compile "
                                                          f"({error.msg})") from None
    return File(replaced.encode(), file.executable), found


def make(repo, hints=regions.DEFAULT_HINTS):
    """The Handout of the solution checked out at `repo`, its prompts at hint level `hints`."""
    rubric = load_module(repo, "grading/rubric.py")
    profile = load_module(repo, "grading/profile.py")
    # the hidden modules, and the file that names them
    hidden = tuple(profile.HIDDEN_TESTS) + ("grading/hidden.py",)
    instructors = INSTRUCTOR_ONLY
    titles = [item.title for item in rubric.ITEMS]
    student = {}
    replaced = []
    for path in tracked_files(repo):
        if is_instructors(path, instructors + hidden) or is_generated(path):
            continue
        student[path], found = student_copy(path, read(repo, path), titles, hints)
        replaced += found
    student["results/README.md"] = File(RESULTS_README.encode())
    hidden_items = {item_id for path in profile.HIDDEN_TESTS
                    for item_id in items_named_in(os.path.join(repo, path))}
    text = assignment.render(text_of(HERE, "ASSIGNMENT.md.in"), rubric, hidden_items, replaced,
                             hints)
    student["ASSIGNMENT.md"] = File(text.encode())
    # the student's own README and GRADING.md: the solution's are the instructor's
    text = student_docs.readme(text_of(HERE, "README.md.in"), rubric, text_of(repo, "README.md"))
    student["README.md"] = File(text.encode())
    student["GRADING.md"] = File(student_docs.grading(text_of(HERE, "GRADING.md.in"), rubric,
                                                      hints).encode())
    return Handout(student, autograder_files(repo, instructors, student), replaced)


def text_of(folder, name):
    """The text of the file `name` in `folder`; empty if there is none."""
    path = os.path.join(folder, name)
    if not os.path.isfile(path):
        return ""
    with open(path) as file:
        return file.read()


def autograder_files(repo, instructors, student):
    """Gradescope's layout: its scripts at the top, beside the grading material and the judge's
    code: every Python module as the student received it (grading/judge.py)."""
    files = {name: read(HERE, name) for name in AUTOGRADER_SCRIPTS}
    files.update({path: file for path, file in student.items()
                  if path.endswith(".py") and not path.startswith(("tests/", "grading/"))})
    for name in GRADING_FILES:
        if not os.path.isfile(os.path.join(repo, name)):
            raise BuildError(f"{os.path.join(repo, name)} not found: the autograder needs it")
        files[name] = read(repo, name)
    if os.path.isfile(os.path.join(repo, "grade.py")):
        files["grade.py"] = read(repo, "grade.py")
    for path in tracked_files(repo):
        if path.startswith(("tests/", "grading/")) and not is_instructors(path, instructors):
            files[path] = read(repo, path)
    return files


def check_out_dir(out_dir, force):
    """Refuse a non-empty OUT_DIR unless `force`; with it, only what a build writes is replaced."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise BuildError(f"{out_dir} exists and is not a folder")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not force:
        raise BuildError(f"{out_dir} exists and is not empty: choose another folder, or pass "
                         "--force to replace its student/, autograder/ and autograder.zip")


def write_tree(folder, files):
    """Write {relative path: File} under `folder`."""
    for path, file in sorted(files.items()):
        target = os.path.join(folder, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as output:
            output.write(file.data)
        os.chmod(target, 0o755 if file.executable else 0o644)


def write_zip(path, files):
    """A zip of `files` at its top level, as Gradescope expects; fixed dates, so the same
    handout gives the same bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, file in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100755 if file.executable else 0o100644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, file.data)


def write(handout, out_dir, force=False):
    """Write OUT_DIR/student/, OUT_DIR/autograder/ and OUT_DIR/autograder.zip."""
    check_out_dir(out_dir, force)
    os.makedirs(out_dir, exist_ok=True)
    for name in OUTPUTS:
        target = os.path.join(out_dir, name)
        if os.path.isdir(target):
            shutil.rmtree(target)
        elif os.path.exists(target):
            os.remove(target)
    write_tree(os.path.join(out_dir, "student"), handout.student)
    write_tree(os.path.join(out_dir, "autograder"), handout.autograder)
    write_zip(os.path.join(out_dir, "autograder.zip"), handout.autograder)
