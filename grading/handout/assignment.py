"""The student's ASSIGNMENT.md from ASSIGNMENT.md.in: the task list made from the rubric and the
solution regions replaced, so the numbering, the marks and the places to write cannot drift from
what is graded."""
import textwrap

from grading.handout.regions import DEFAULT_HINTS

PERSON = "read by a person against the rubric; no test earns it"
# What the prompts give at each hint level (make_handout.py --hints), as the student's documents
# say it: the reader of "is the code your own" judges against it.
PROMPTS_GIVE = {
    "none": "the contract alone (what must hold when your code returns, and the interface)",
    "outline": "the contract (what must hold when your code returns, and the interface), then "
               "the approach in a sentence or two, after \"The approach:\"",
    "steps": "the contract (what must hold when your code returns, and the interface), then the "
             "approach (\"The approach:\") and each step (\"Step by step:\")",
}


def by_person(item):
    """Whether a person grades the item, not the tests."""
    return item.graded_by == "person"


def marks_text(marks):
    """'1 mark', '2 marks', '0.5 marks'."""
    return f"{marks:g} mark" + ("" if marks == 1 else "s")


def tasks_text(numbers):
    """'Task 3', 'Tasks 3 and 5', 'Tasks 1 to 9' (a run of three or more), 'Tasks 1, 3 and 5'."""
    numbers = sorted(numbers)
    if len(numbers) == 1:
        return f"Task {numbers[0]}"
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"Tasks {numbers[0]} to {numbers[-1]}"
    return f"Tasks {', '.join(str(number) for number in numbers[:-1])} and {numbers[-1]}"


def numbers_of(rubric):
    """{item id: its task number}: the tasks are numbered as the rubric lists its items."""
    return {item.id: number for number, item in enumerate(rubric.ITEMS, start=1)}


def how_checked(item):
    """How a task is graded, in a few words: the command that runs its tests, or who reads it."""
    if by_person(item):
        return PERSON
    return f"its public tests: `python -m pytest -k {item.id}`"


def places(task, regions):
    """The table of where Task `task` is to be written."""
    rows = ["| file | where | what |", "|---|---|---|"]
    for region in regions:
        if region.task == task:
            where = region.where if region.path.endswith(".md") else f"`{region.where}`"
            rows.append(f"| `{region.path}` | {where} | {region.label or '(the whole task)'} |")
    return "\n".join(rows) if len(rows) > 2 else "Nothing to write in the code for this task."


def paragraph(text):
    """`text` wrapped at 100 columns, never inside a hyphenated word."""
    return textwrap.fill(text, 100, break_on_hyphens=False)


def dependencies(rubric):
    """The sentence that says which tasks' tests also run the code of other tasks."""
    numbers = numbers_of(rubric)
    clauses = [f"Task {numbers[item.id]} ({item.title}), whose tests also need the code of "
               f"{tasks_text(numbers[other] for other in item.builds_on)}"
               for item in rubric.ITEMS if item.builds_on]
    if not clauses:
        return "none."
    if len(clauses) > 1:
        clauses = ["; ".join(clauses[:-1]) + ";"] + ["and " + clauses[-1]]
    return " ".join(clauses) + "."


def main_job_lines(item, numbers):
    """How to run a task's code end to end: the tasks the main job needs first, and the command
    that reaches it, in a block of its own (a command is never cut); none where the task has no
    such command."""
    options = getattr(item, "main_job", "")
    if not options:
        return []
    needs = getattr(item, "main_job_needs", ())
    first = (f", once {tasks_text(numbers[other] for other in needs)} "
             f"{'is' if len(needs) == 1 else 'are'} written too (it runs them first)"
             if needs else "")
    return [paragraph(f"**Running it end to end.** The main job calls this task's code with these "
                      f"options{first}:"), "", f"    python mlp_ddp.py {options}", ""]


def fill_in(template, placeholder, text):
    """`template` with `placeholder` replaced by `text`, and the paragraph that held it wrapped
    again at 100 columns (a paragraph: lines between blank lines)."""
    paragraphs = template.split("\n\n")
    for index, block in enumerate(paragraphs):
        if placeholder in block:
            paragraphs[index] = paragraph(" ".join(block.replace(placeholder, text).split()))
    return "\n\n".join(paragraphs)


def task_section(number, item, regions, hidden_items, numbers):
    """One task: its marks, how it is graded, where to write it, and what is judged."""
    heading = f"{marks_text(item.marks)} · rubric item `{item.id}` · "
    if len(heading + how_checked(item)) > 100:  # a command is never cut: it goes on its own line
        heading = heading.rstrip() + "\n"
    lines = [f"### Task {number}: {item.title}", "", heading + how_checked(item), ""]
    if item.builds_on:
        others = tasks_text(numbers[other] for other in item.builds_on)
        lines += [paragraph(f"Its tests also run the code of {others}: they pass once those "
                            "are written too."), ""]
    lines += [places(number, regions), ""]
    lines += main_job_lines(item, numbers)
    if by_person(item):
        lines.append(paragraph("**What the reader looks for.** " + item.needs_human))
    else:
        if item.checks:
            lines += [paragraph(f"**What the tests check.** {item.checks}"), ""]
        lines.append(paragraph(f"**What a reader also judges.** {item.needs_human}"))
    if item.id in hidden_items:
        lines += ["", "Hidden tests, which only the autograder has, also grade this task."]
    return "\n".join(lines)


def render(template, rubric, hidden_items, regions, hints=DEFAULT_HINTS):
    """ASSIGNMENT.md from its template: @TASKS@ becomes the tasks, @MARKS@ a paragraph with the
    marks in all, @DEPENDENCIES@ the tasks whose tests run the code of others, @PROMPTS_GIVE@
    what the prompts give at hint level `hints`; `hidden_items`: the items hidden tests also
    grade."""
    numbers = numbers_of(rubric)
    sections = [task_section(numbers[item.id], item, regions, hidden_items, numbers)
                for item in rubric.ITEMS]
    template = fill_in(template, "@DEPENDENCIES@", dependencies(rubric))
    template = fill_in(template, "@PROMPTS_GIVE@", PROMPTS_GIVE[hints])
    return template.replace("@TASKS@", "\n\n".join(sections)).replace("@MARKS@", marks(rubric))


def marks_of(rubric, chosen, what):
    """'N for `what` (Tasks i to j)': the items `chosen` picks."""
    numbered = [(number, item) for number, item in enumerate(rubric.ITEMS, start=1)
                if chosen(item)]
    total = sum(item.marks for _, item in numbered)
    return f"{total:g} for {what} ({tasks_text(number for number, _ in numbered)})"


def marks(rubric):
    """The paragraph that says what the assignment is worth, for what, and who grades it."""
    total = sum(item.marks for item in rubric.ITEMS)
    code = marks_of(rubric, lambda item: item.id.startswith("core."), "the code")
    numbers = marks_of(rubric, lambda item: item.id.startswith("design.") and not by_person(item),
                       "the design document's numbers and derivations")
    sections = marks_of(rubric, by_person, "the design document's sections")
    tested = [number for number, item in enumerate(rubric.ITEMS, start=1) if not by_person(item)]
    return paragraph(f"The assignment is worth {total:g} marks: {code}, {numbers} and {sections}. "
                     f"The tests grade {tasks_text(tested)}; a person reads each of the others "
                     "against the rubric.")
