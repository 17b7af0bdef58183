"""make_handout.py: the student's copy holds no line of any solution region and still compiles, the
hidden tests are only in the autograder, run_autograder always leaves a results.json, and a wrong
marker or a folder in use stops the build with one line."""
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest

import make_handout
from grading.profile import HIDDEN_TESTS, TASK_FILES
from grading.rubric import ITEMS
from tests.harness import REPO

# Lines that say nothing about a solution: they may appear anywhere.
TRIVIAL = {"pass", "return", "else:", "try:", "finally:", "yield", "return None"}


def files_under(folder):
    """Every file below `folder`, relative to it."""
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


def text_of(path):
    """The file's text; None for a binary file."""
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except UnicodeDecodeError:
        return None


def solution_lines(student):
    """(lines inside solution regions, lines outside them) of the solution's files that the
    student's copy has, each stripped; found here by plain text, not by the build's parser."""
    inside, outside = set(), set()
    for path in files_under(student):
        source = os.path.join(REPO, path)
        text = text_of(source) if os.path.isfile(source) else None
        in_region = False
        for line in (text or "").splitlines():
            if "BEGIN SOLUTION" in line or "END SOLUTION" in line:
                in_region = "BEGIN" in line
                continue
            (inside if in_region else outside).add(line.strip())
    return inside, outside


def test_no_line_of_any_solution_region_is_in_the_handout(out):
    student = os.path.join(out, "student")
    inside, outside = solution_lines(student)
    # Given code may repeat a line of a region (`self.grads_ready = 0`): only the others count.
    secret = {line for line in inside - outside
              if line not in TRIVIAL and any(char.isalnum() for char in line)}
    assert len(secret) > 500  # the regions were found: the scan below is not vacuous
    leaks = [f"{path}:{number}: {line.strip()}" for path in files_under(student)
             for number, line in enumerate((text_of(os.path.join(student, path)) or "")
                                           .splitlines(), start=1)
             if line.strip() in secret]
    assert leaks == []


def test_each_region_becomes_its_prompt_and_a_raise_and_every_task_has_one(out):
    student = os.path.join(out, "student")
    raises, quotes = [], []
    for path in files_under(student):
        for line in (text_of(os.path.join(student, path)) or "").splitlines():
            if path.endswith(".py") and 'raise NotImplementedError("Task ' in line:
                raises.append(int(line.split("Task ")[1].split(":")[0]))
            if path.endswith(".md") and line.startswith("> **Task "):
                quotes.append(int(line.split("Task ")[1].split(":")[0]))
    with open(os.path.join(REPO, "runtime", "models.py")) as file:
        begins = sum(line.strip().startswith("# BEGIN SOLUTION") for line in file)
    assert begins == 2 and raises.count(1) == begins
    # a task a person grades is written in the design document's templates; every other task in
    # the code, but the main job, which has nothing of its own to write
    numbers = {item.id: number for number, item in enumerate(ITEMS, start=1)}
    by_person = {numbers[item.id] for item in ITEMS if item.graded_by == "person"}
    assert set(quotes) == by_person
    assert set(raises) == set(numbers.values()) - by_person - {numbers["core.end_to_end"]}
    with open(os.path.join(student, "runtime", "models.py")) as file:
        models = file.read()
    assert "        # Run the images through the layers.\n" \
           '        raise NotImplementedError("Task 1: the MLP\'s forward")\n' in models
    assert "BEGIN" not in models and "nn.init.xavier_uniform_" not in models


def test_every_python_file_of_the_handout_compiles(out):
    student = os.path.join(out, "student")
    python = [path for path in files_under(student) if path.endswith(".py")]
    assert "manual_allreduce.py" in python and "runtime/manual_ddp.py" in python
    for path in python:
        with open(os.path.join(student, path)) as file:
            compile(file.read(), path, "exec")


def test_hidden_tests_instructor_files_and_generated_ones_stay_out_of_the_students_copy(out):
    student = set(files_under(os.path.join(out, "student")))
    autograder = set(files_under(os.path.join(out, "autograder")))
    hidden = [path for path in HIDDEN_TESTS if os.path.isfile(os.path.join(REPO, path))]
    assert "tests/test_ddp_parity.py" in hidden
    for path in hidden:
        assert path not in student and path in autograder
    assert not {"make_handout.py", "grade.py", "grading/tests/test_handout.py"} & student
    assert not any(path.startswith("handout/") for path in student)
    # a working variant of the ring's exchange would hand Task 3 out
    assert not any(path.startswith("benchmarks/ring_variants/") for path in student)
    assert {path for path in student if path.startswith("results/")} == {"results/README.md"}
    design = {path for path in student if path.startswith("design_doc/")}
    assert design and all(path.startswith("design_doc/templates/") for path in design)
    assert {"ASSIGNMENT.md", "tests/conftest.py", "grading/rubric.py"} <= student


def test_the_students_copy_names_no_hidden_test(out):
    hidden = [os.path.basename(path) for path in HIDDEN_TESTS]
    assert "grading/hidden.py" not in set(files_under(os.path.join(out, "student")))
    naming = []
    for path in files_under(os.path.join(out, "student")):
        with open(os.path.join(out, "student", path), "rb") as file:
            text = file.read().decode(errors="replace")
        naming += [f"{path} names {name}" for name in hidden if name in text]
    assert naming == []


def test_the_judge_gets_every_task_module_as_the_student_does_and_nothing_of_the_solution(out):
    """The autograder's judge imports the student's copy of each module (grading/judge.py):
    the task modules are exactly the Python files with solution regions."""
    student, autograder = (os.path.join(out, name) for name in ("student", "autograder"))
    with_regions = set()
    for path in files_under(student):
        text = text_of(os.path.join(student, path)) or ""
        if path.endswith(".py") and 'raise NotImplementedError("Task ' in text:
            with_regions.add(path)
    assert with_regions == set(TASK_FILES)
    for path in files_under(student):
        if path.endswith(".py") and not path.startswith("tests/"):
            assert text_of(os.path.join(autograder, path)) == text_of(os.path.join(student, path))


def test_the_zip_holds_the_autograder_folder_with_its_scripts_executable(out):
    autograder = os.path.join(out, "autograder")
    with zipfile.ZipFile(os.path.join(out, "autograder.zip")) as archive:
        infos = {info.filename: info for info in archive.infolist()}
    assert sorted(infos) == files_under(autograder)
    assert {"setup.sh", "run_autograder", "requirements.txt", "pyproject.toml"} <= set(infos)
    for script in ("setup.sh", "run_autograder"):
        assert (infos[script].external_attr >> 16) & stat.S_IXUSR
        assert os.access(os.path.join(autograder, script), os.X_OK)


def test_run_autograder_writes_nothing_into_the_submission_and_always_writes_results_json(
        out, tmp_path):
    root = tmp_path / "autograder"
    shutil.copytree(os.path.join(out, "autograder"), root / "source")
    (root / "source" / "grade.py").write_text("print('grader crashed here')\nraise SystemExit(3)\n")
    tampered = root / "submission" / "tests" / "test_models.py"
    tampered.parent.mkdir(parents=True)
    tampered.write_text("def test_nothing():\n    pass\n")
    environment = dict(os.environ, AUTOGRADER_ROOT=str(root), PYTHON=sys.executable)
    completed = subprocess.run([str(root / "source" / "run_autograder")], env=environment,
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    results = json.loads((root / "results" / "results.json").read_text())
    assert results["score"] == 0 and results["tests"] == []
    assert "exit status 3" in results["output"] and "grader crashed here" in results["output"]
    # grade.py puts the instructor's tests over a copy (grading/tests/test_grade.py); a link in the
    # submission must find nothing written through it
    assert tampered.read_text() == "def test_nothing():\n    pass\n"


# A grade.py that gives 0, and meanwhile rewrites what run_autograder has not run yet, keeping
# every byte before it: a script bash reads as it goes would then write a score of 32.
REWRITES_RUN_AUTOGRADER = """
import json, sys

script = "run_autograder"
text = open(script).read()
call = text.index("grade.py", text.index("if [ -f grade.py ]") + 20)
after_me = text.index("fi\\n", call) + 3  # the end of the if that bash has read whole
forged = 'echo \\'{"score": 32, "tests": []}\\' > "$ROOT/results/results.json"; exit 0\\n'
with open(script, "r+") as file:
    file.seek(after_me)
    file.write(forged + "#" * max(0, len(text) - after_me - len(forged)))
with open(sys.argv[sys.argv.index("--gradescope") + 1], "w") as file:
    json.dump({"score": 0, "tests": []}, file)
"""


def test_run_autograder_cannot_be_rewritten_while_it_runs(out, tmp_path):
    root = tmp_path / "autograder"
    shutil.copytree(os.path.join(out, "autograder"), root / "source")
    (root / "source" / "grade.py").write_text(REWRITES_RUN_AUTOGRADER)
    (root / "submission").mkdir()
    environment = dict(os.environ, AUTOGRADER_ROOT=str(root), PYTHON=sys.executable)
    completed = subprocess.run([str(root / "source" / "run_autograder")], env=environment,
                               capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    assert "32" in (root / "source" / "run_autograder").read_text()  # it was rewritten
    assert json.loads((root / "results" / "results.json").read_text())["score"] == 0


def make_source(tmp_path, name, text):
    """A git checkout holding the rubric, the profile, what the autograder needs, and one file
    `name` with `text`."""
    source = tmp_path / "source"
    (source / "grading").mkdir(parents=True)
    for part in ("rubric.py", "profile.py"):
        shutil.copy(os.path.join(REPO, "grading", part), source / "grading")
    for part in ("requirements.txt", "pyproject.toml"):
        shutil.copy(os.path.join(REPO, part), source)
    (source / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(source)], check=True)
    subprocess.run(["git", "-C", str(source), "add", "."], check=True)
    return str(source)


PROMPT = "# BEGIN PROMPT\n# Say hello.\n# END PROMPT\n"
INDENTED = "    " + PROMPT.replace("\n#", "\n    #")  # the prompt inside a function
MARKER_ERRORS = {
    "unclosed": ("a.py", "def f():\n" + INDENTED + "    # BEGIN SOLUTION Task 1\n    return 1\n",
                 "a.py:5: unclosed BEGIN SOLUTION"),
    "nested": ("a.py", PROMPT + "# BEGIN SOLUTION Task 1\nx = 1\n" + PROMPT,
               "a.py:6: BEGIN PROMPT inside the solution region opened at line 4"),
    "misspelt": ("a.py", PROMPT + "# BEGIN SOLUTON Task 1\nx = 1\n# END SOLUTION\n",
                 "a.py:4: misspelt marker '# BEGIN SOLUTON Task 1'"),
    "end without begin": ("a.py", "x = 1\n# END SOLUTION\n",
                          "a.py:2: END SOLUTION without BEGIN SOLUTION"),
    "no such task": ("a.py", PROMPT + "# BEGIN SOLUTION Task 99\nx = 1\n# END SOLUTION\n",
                     "a.py:4: Task 99 is not a rubric item"),
    "outside python and markdown": ("a.sh", "echo hi\n# BEGIN SOLUTION Task 1\n",
                                    "a.sh:2: solution regions are read only in .py and .md"),
    "markdown misspelt": ("a.md", "<!-- BEGIN PROMPT\nSay hello.\nEND PROMPT -->\n"
                          "<!-- BEGIN SOLUTION Task 5 -->\nHello.\n<!-- END SOLUTON -->\n",
                          "a.md:6: misspelt marker '<!-- END SOLUTON -->'"),
    "hint misspelt": ("a.py", PROMPT.replace("# END", "# HINTS outlines\n# Go.\n# END")
                      + "# BEGIN SOLUTION Task 1\nx = 1\n# END SOLUTION\n",
                      "a.py:3: '# HINTS outlines': the hint markers are 'HINTS outline' then"),
    "hints out of order": ("a.py", PROMPT.replace("# END", "# HINTS steps\n# Go.\n"
                                                  "# HINTS outline\n# Go.\n# END")
                           + "# BEGIN SOLUTION Task 1\nx = 1\n# END SOLUTION\n",
                           "a.py:5: '# HINTS outline': the hint markers are"),
    "hints before the contract": ("a.py", "# BEGIN PROMPT\n# HINTS outline\n# Go.\n# END PROMPT\n"
                                  "# BEGIN SOLUTION Task 1\nx = 1\n# END SOLUTION\n",
                                  "a.py:2: a prompt opens with its contract, before its hints"),
}


@pytest.mark.parametrize("case", MARKER_ERRORS)
def test_a_wrong_marker_stops_the_build_naming_file_and_line(case, tmp_path, capsys):
    name, text, message = MARKER_ERRORS[case]
    source = make_source(tmp_path, name, text)
    out = tmp_path / "out"
    assert make_handout.main([str(out), "--source", source]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: {message}") and error.count("\n") == 1
    assert not out.exists()  # nothing written


def test_a_good_region_in_another_checkout_becomes_its_prompt(tmp_path):
    source = make_source(tmp_path, "a.py", "def f():\n" + INDENTED
                         + "    # BEGIN SOLUTION Task 2: hello\n    return 1\n    # END SOLUTION\n")
    assert make_handout.main([str(tmp_path / "out"), "--source", source]) == 0
    student = (tmp_path / "out" / "student" / "a.py").read_text()
    assert student == ('def f():\n    # Say hello.\n'
                       '    raise NotImplementedError("Task 2: hello")\n')


def test_a_folder_that_is_not_empty_is_refused_unless_forced(tmp_path):
    kept = tmp_path / "notes.txt"
    kept.write_text("mine\n")
    command = [sys.executable, os.path.join(REPO, "make_handout.py"), str(tmp_path)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "is not empty" in refused.stderr and "Traceback" not in refused.stderr
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]
    forced = subprocess.run(command + ["--force"], capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert sorted(os.listdir(tmp_path)) == ["autograder", "autograder.zip", "notes.txt", "student"]
    assert kept.read_text() == "mine\n"


def test_assignment_md_lists_every_rubric_item_as_a_numbered_task(out):
    with open(os.path.join(out, "student", "ASSIGNMENT.md")) as file:
        assignment = file.read()
    for number, item in enumerate(ITEMS, start=1):
        assert f"### Task {number}: {item.title}\n" in assignment
        marks = f"{item.marks:g} mark" + ("" if item.marks == 1 else "s")
        assert f"{marks} · rubric item `{item.id}`" in assignment
        # a task a person grades has no tests to run: it says who reads it, and what for
        by_person = item.graded_by == "person"
        assert (f"-k {item.id}`" in assignment) != by_person
        assert (f"rubric item `{item.id}` · read by a person" in assignment) == by_person
    assert "python -m pytest" in assignment
    assert "@TASKS@" not in assignment and "@MARKS@" not in assignment


def test_each_task_hidden_tests_also_grade_says_so_and_no_other(out):
    # the hidden modules' markers name the items they count for: the student learns which tasks
    # they grade, never which tests
    from grading.plugin import items_named_in
    from grading.profile import HIDDEN_TESTS

    graded = {item_id for path in HIDDEN_TESTS
              for item_id in items_named_in(os.path.join(REPO, path))}
    assert {"core.sharding_collectives", "core.zero", "core.fsdp"} <= graded
    with open(os.path.join(out, "student", "ASSIGNMENT.md")) as file:
        sections = file.read().split("\n### Task ")[1:]
    for number, item in enumerate(ITEMS, start=1):
        section = next(text for text in sections if text.startswith(f"{number}: "))
        says = "Hidden tests, which only the autograder has, also grade this task." in section
        assert says == (item.id in graded), f"Task {number} ({item.id})"


MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](image)
COMMANDS = (re.compile(r"\bpython3? -m ([\w.]+)"), re.compile(r"\bpython3? ([\w/]+\.py)\b"),
            re.compile(r"(?<![\w.])\./([\w/.-]+\.sh)\b"))
NOT_OURS = {"venv", "pip", "pytest"}  # modules a command may run that are not the repository's


def markdown_files(folder):
    return [path for path in files_under(folder) if path.endswith(".md")]


def test_every_link_and_image_in_the_students_markdown_is_in_the_students_copy(out):
    student = os.path.join(out, "student")
    broken = []
    for path in markdown_files(student):
        for target in MARKDOWN_LINK.findall(text_of(os.path.join(student, path))):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same file
            linked = os.path.join(student, os.path.dirname(path), target.split("#")[0])
            if not os.path.exists(linked):
                broken.append(f"{path} -> {target}")
    assert broken == []


def test_every_command_the_students_guides_name_exists_in_the_students_copy(out):
    student = os.path.join(out, "student")
    missing = []
    for guide in ("README.md", "ASSIGNMENT.md", "GRADING.md"):
        text = text_of(os.path.join(student, guide))
        for module in COMMANDS[0].findall(text):
            if module.split(".")[0] in NOT_OURS:
                continue
            relative = module.replace(".", "/")
            if not any(os.path.isfile(os.path.join(student, relative + suffix))
                       for suffix in (".py", "/__main__.py")):
                missing.append(f"{guide}: python -m {module}")
        for pattern in COMMANDS[1:]:
            missing += [f"{guide}: {name}" for name in pattern.findall(text)
                        if not os.path.isfile(os.path.join(student, name))]
    assert missing == []


def test_the_students_readme_and_grading_are_written_for_the_student(out):
    student = os.path.join(out, "student")
    readme = text_of(os.path.join(student, "README.md"))
    grading = text_of(os.path.join(student, "GRADING.md"))
    for text in (readme, grading):
        assert "instructor" not in text.lower() and "grade.py" not in text
        assert "make_handout" not in text and "reference solution" not in text
    # every task in order, with the command that checks it alone or, for a task a person grades,
    # who reads it; and the timing definitions
    for number, item in enumerate(ITEMS, start=1):
        assert f"Task {number}, {item.title}" in readme and f"`{item.id}`" in grading
        assert (f"-k {item.id}`" in readme) != (item.graded_by == "person")
    assert "read by a person against the rubric" in readme
    assert "## Timing: what the numbers mean" in readme and "comm_exposed" in readme
    assert not os.path.exists(os.path.join(student, ".ci"))  # the solution's CI, not theirs


def test_the_students_quick_start_test_command_runs_on_the_handout(out):
    # the second command of the quick start, on the untouched handout: the tests of Task 1 run
    # and fail (exit code 1, not a collection or usage error), and the table of marks is printed
    done = subprocess.run([sys.executable, "-m", "pytest", "-k", "core.mlp", "-q",
                           "-p", "no:cacheprovider"], cwd=os.path.join(out, "student"),
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OFFLINE_DATA_DIR=""))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "python -m pytest -k core.mlp" in text_of(os.path.join(out, "student", "README.md"))
    assert "core.mlp" in done.stdout and "NotImplementedError" in done.stdout


def test_an_item_alone_must_earn_itself_and_what_it_builds_on_and_nothing_else():
    from grading.handout.self_check import check_one_item

    item = next(entry for entry in ITEMS if entry.builds_on)
    other = next(entry for entry in ITEMS
                 if entry.id != item.id and entry.id not in item.builds_on)

    def report(earned):
        return {"items": [{"id": entry.id, "marks": entry.marks, "status": "-",
                           "earned": entry.marks if entry.id in earned else 0}
                          for entry in ITEMS],
                "tests": [{"nodeid": "tests/t.py::test_x", "items": [item.id],
                           "outcome": "failed", "output": "E  what went wrong"}]}

    assert check_one_item(report({item.id, *item.builds_on}), item) == []
    short = check_one_item(report(set(item.builds_on)), item)
    assert short[0].startswith(f"{item.id} alone: {item.id} earned 0")
    assert short[1] == "  tests/t.py::test_x: failed: E  what went wrong"
    assert check_one_item(report({item.id, *item.builds_on, other.id}), item) == [
        f"{item.id} alone: {other.id} earned {other.marks:g} too"]


def test_a_solved_grade_cut_short_by_the_budget_fails_the_self_check():
    # items the budget left "not assessed" prove nothing: the self-check must not pass on them
    from grading.handout.self_check import check_solved

    items = [{"id": item.id, "marks": item.marks, "status": "not assessed", "earned": None}
             for item in ITEMS]
    reason = "the budget ran out: 9 tests not run"
    cut = {"items": items, "tests": [], "incomplete_because": [reason]}
    assert check_solved(cut) == [f"handout with the solution: incomplete: {reason}"]
    assert check_solved({**cut, "incomplete_because": []}) == []


SECTION = re.compile(r"(\w+(?:/\w+)*\.py), sections? (\d+)(?: (?:and|to) (\d+))?")
TORCH_NAME = re.compile(r"\bdist\.(\w+)")
README_SECTION = re.compile(r"README: ([\w ,'-]+?)[).]")


def test_what_the_students_documents_point_at_resolves(out):
    """A section of a file, a README section or a torch.distributed name that a student's document,
    a task's docstring or the rubric names exists, and the torch name is not deprecated (its
    FutureWarning would fill every failure)."""
    import torch.distributed as dist

    student = os.path.join(out, "student")
    texts = {name: text_of(os.path.join(student, name))
             for name in ("README.md", "ASSIGNMENT.md", "GRADING.md", "requirements.txt",
                          *TASK_FILES)}
    texts["the rubric"] = "\n".join(f"{item.checks} {item.needs_human}" for item in ITEMS)
    readme = texts["README.md"]
    broken = []
    for where, text in texts.items():
        for path, first, last in SECTION.findall(text):
            numbers = range(int(first), int(last or first) + 1)
            headers = text_of(os.path.join(student, path)) or ""
            broken += [f"{where}: {path}, section {number}" for number in numbers
                       if not re.search(rf"^# --- (\d+ and )?{number}[. ]", headers, re.M)]
        for name in TORCH_NAME.findall(text):
            function = getattr(dist, name, None)
            if function is None or getattr(function, "__deprecated__", None):
                broken.append(f"{where}: dist.{name} is {'deprecated' if function else 'unknown'}")
        broken += [f"{where}: README: {title}" for title in README_SECTION.findall(text)
                   if f"# {title}" not in readme]
    assert broken == []
