"""What the handout's options and the rubric's main-job commands give the student: the prompts at
each hint level (the contract always, the hints as chosen), the command that runs each task's
code end to end, and pytest's options in the student's copy."""
import os
import shlex

import pytest

import make_handout
from grading.handout import build, regions
from grading.handout.assignment import PROMPTS_GIVE, tasks_text
from grading.handout.build import STUDENT_ADDOPTS
from grading.rubric import ITEMS
from grading.tests.test_handout import files_under, make_source, text_of
from runtime.options import build_parser
from tests.harness import REPO

LAYERED = ("def f():\n    # BEGIN PROMPT\n    # Return 1.\n    # HINTS outline\n    # A constant."
           "\n    # HINTS steps\n    # Write return 1.\n    # END PROMPT\n"
           "    # BEGIN SOLUTION Task 2: one\n    return 1\n    # END SOLUTION\n")
SHOWN = {"none": "    # Return 1.\n",
         "outline": "    # Return 1.\n    # The approach:\n    # A constant.\n",
         "steps": "    # Return 1.\n    # The approach:\n    # A constant.\n"
                  "    # Step by step:\n    # Write return 1.\n"}


@pytest.mark.parametrize("hints", SHOWN)
def test_each_hint_level_keeps_the_contract_and_the_hint_layers_up_to_it(hints, tmp_path):
    source = make_source(tmp_path, "a.py", LAYERED)
    assert make_handout.main([str(tmp_path / "out"), "--source", source, "--hints", hints]) == 0
    student = (tmp_path / "out" / "student" / "a.py").read_text()
    assert student == f'def f():\n{SHOWN[hints]}    raise NotImplementedError("Task 2: one")\n'


def test_the_default_hint_level_is_the_outline():
    assert regions.DEFAULT_HINTS == "outline"
    assert "outline (the default" in make_handout.__doc__


@pytest.mark.parametrize("hints", ["none", "steps"])
def test_the_handout_builds_at_hint_levels_none_and_steps_with_every_prompt_a_contract(
        hints, tmp_path):
    folder = tmp_path / "out"
    assert make_handout.main([str(folder), "--hints", hints]) == 0
    handout = build.make(REPO, hints)
    for region in handout.regions:
        # a prompt, where there is one, opens with its contract: not with a hint
        if region.prompt:
            assert any(line.strip("# ") for line in region.layers["none"]), region
    student = {path: text_of(os.path.join(folder, "student", path))
               for path in files_under(os.path.join(folder, "student")) if path.endswith(".py")}
    for path, text in student.items():
        compile(text, path, "exec")
    said = "".join(student.values())
    assert ("Step by step:" in said) == (hints == "steps")
    assert ("The approach:" in said) == (hints == "steps")
    assert "When it returns, rank r's `output` holds chunk r" in student["manual_sharding.py"]
    # the student's documents say what the prompts give: the reader judges the code against it
    for name in ("ASSIGNMENT.md", "GRADING.md"):
        document = " ".join(text_of(os.path.join(folder, "student", name)).split())
        assert PROMPTS_GIVE[hints] in document and "@PROMPTS_GIVE@" not in document


def test_each_task_of_the_code_says_how_the_main_job_runs_it_and_what_it_needs_first(out):
    with open(os.path.join(out, "student", "ASSIGNMENT.md")) as file:
        assignment = file.read()
    numbers = {item.id: number for number, item in enumerate(ITEMS, start=1)}
    sections = assignment.split("\n### Task ")[1:]
    for number, item in enumerate(ITEMS, start=1):
        section = sections[number - 1]
        tested_code = item.id.startswith("core.") and item.id != "core.end_to_end"
        assert bool(item.main_job) == tested_code, item.id
        assert ("    python mlp_ddp.py " in section) == tested_code, section
        if not tested_code:
            continue
        assert f"\n    python mlp_ddp.py {item.main_job}\n" in section
        assert item.id not in item.main_job_needs
        needed = " ".join(section.split("**Running it end to end.**")[1].split(":")[0].split())
        assert tasks_text(numbers[other] for other in item.main_job_needs) in needed
    # the main job's default transport never calls the ring: its tasks name the flag that does
    by_id = {item.id: item for item in ITEMS}
    for ring in ("core.ring", "core.sharding_collectives"):
        assert "--transport ring" in by_id[ring].main_job


def test_each_tasks_main_job_options_are_the_main_jobs():
    for item in ITEMS:
        if not item.main_job:
            continue
        _, unknown = build_parser("the main job").parse_known_args(shlex.split(item.main_job))
        assert unknown == [], (item.id, unknown)


def test_the_students_pytest_shows_short_tracebacks_and_no_slowest_durations(out):
    with open(os.path.join(out, "student", "pyproject.toml")) as file:
        student = file.read()
    with open(os.path.join(out, "autograder", "pyproject.toml")) as file:
        autograder = file.read()
    assert STUDENT_ADDOPTS in student.splitlines() and "--durations" not in student
    # the grader runs with the solution's own options
    with open(os.path.join(REPO, "pyproject.toml")) as file:
        assert autograder == file.read()


def test_a_pyproject_without_pytests_options_stops_the_build(tmp_path, capsys):
    source = make_source(tmp_path, "a.py", "x = 1\n")
    pyproject = os.path.join(source, "pyproject.toml")
    with open(pyproject) as file:
        text = file.read()
    with open(pyproject, "w") as file:
        file.write("\n".join(line for line in text.splitlines()
                             if not line.startswith("addopts")))
    assert make_handout.main([str(tmp_path / "out"), "--source", source]) == 2
    assert "must have one line 'addopts = ...'" in capsys.readouterr().err
