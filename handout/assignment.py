"""The student's ASSIGNMENT.md: ASSIGNMENT.md.in with its task list made from the rubric and from
the solution regions the handout replaced, so the numbering, the marks and the places to write
cannot drift from what is graded."""
import fnmatch
import textwrap


def item_of(rubric, path):
    """The rubric item ids the tests of the file at `path` count for: the first of rubric.TESTS'
    rules that matches its node ids (a glob for their start, case-insensitive)."""
    node = f"{path}::".lower()
    for pattern, items in rubric.TESTS:
        if fnmatch.fnmatch(node, pattern.lower() + "*"):
            if items is None:
                return ()
            return (items,) if isinstance(items, str) else tuple(items)
    return ()


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


def task_section(number, item, regions, hidden_items):
    """One task: its marks, how to run its tests, where to write it, and how it is graded."""
    lines = [f"### Task {number}: {item.title}", "",
             f"{item.marks:g} marks · rubric item `{item.id}` · its public tests: "
             f"`python -m pytest -k {item.id}`", "",
             places(number, regions), "",
             paragraph(f"**What the tests check.** {item.checks}"), "",
             paragraph(f"**What a reader also judges.** {item.needs_human}")]
    if item.id in hidden_items:
        lines += ["", "Hidden tests, which only the autograder has, also grade this task."]
    return "\n".join(lines)


def marks_of(rubric, prefix, what):
    """'N marks for `what` (Tasks i, j, ...)': the items whose id starts with `prefix`."""
    numbered = [(number, item) for number, item in enumerate(rubric.ITEMS, start=1)
                if item.id.startswith(prefix)]
    marks = sum(item.marks for _, item in numbered)
    return f"{marks:g} for {what} (Tasks {', '.join(str(number) for number, _ in numbered)})"


def render(template, rubric, hidden, regions):
    """ASSIGNMENT.md from its template: @TASKS@ becomes the tasks, @MARKS@ a paragraph with the
    marks in all."""
    hidden_items = {item for path in hidden for item in item_of(rubric, path)}
    sections = [task_section(number, item, regions, hidden_items)
                for number, item in enumerate(rubric.ITEMS, start=1)]
    return template.replace("@TASKS@", "\n\n".join(sections)).replace("@MARKS@", marks(rubric))


def marks(rubric):
    """The paragraph that says what the assignment is worth, and for what."""
    total = sum(item.marks for item in rubric.ITEMS)
    return paragraph(f"The assignment is worth {total:g} marks: "
                     f"{marks_of(rubric, 'core.', 'the code')}, "
                     f"{marks_of(rubric, 'design.', 'the design document')}.")
