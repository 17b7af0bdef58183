"""The student's README.md and GRADING.md, from their templates: the tasks' order and marks from
the rubric, the timing definitions from the solution's README, so neither can drift from what is
graded or measured. The solution's own README and GRADING.md are the instructor's."""
import textwrap

from grading.handout.assignment import (
    PROMPTS_GIVE,
    by_person,
    dependencies,
    fill_in,
    how_checked,
    marks,
    marks_text,
)
from grading.handout.regions import DEFAULT_HINTS

TIMING = "## Timing: what the numbers mean"  # the README section the student's copy keeps


def section(markdown, heading):
    """The section of `markdown` that starts with the line `heading`, up to the next `## `; empty
    where there is none (a checkout without the README)."""
    if heading + "\n" not in markdown:
        return ""
    start = markdown.index(heading + "\n")
    end = markdown.find("\n## ", start + len(heading))
    return markdown[start:end if end >= 0 else len(markdown)].rstrip() + "\n"


def order_line(number, item):
    """One task in README's order list: the command that checks it, or who reads it and what
    for; wrapped at 100 columns, except a command, which is never cut."""
    line = f"{number}. Task {number}, {item.title} ({marks_text(item.marks)}): "
    if not by_person(item):
        command = f"`python -m pytest -k {item.id}`"
        if len(line + command) > 100:
            return line.rstrip() + "\n" + " " * len(f"{number}. ") + command
        return line + command
    text = (line + f"{how_checked(item)}. The rubric's note to the reader: \"{item.needs_human}\" "
            f"Where to write it: ASSIGNMENT.md, Task {number}.")
    return textwrap.fill(text, 100, subsequent_indent=" " * len(f"{number}. "),
                         break_on_hyphens=False)


def readme(template, rubric, solution_readme):
    """README.md: @ORDER@ becomes the tasks with the command that checks each (or who reads it),
    @DEPENDENCIES@ the tasks whose tests run the code of others, @TIMING@ the solution README's
    timing definitions."""
    order = "\n".join(order_line(number, item)
                      for number, item in enumerate(rubric.ITEMS, start=1))
    timing = section(solution_readme, TIMING)
    template = fill_in(template, "@DEPENDENCIES@", dependencies(rubric))
    return template.replace("@ORDER@", order).replace("@TIMING@", timing.rstrip())


def grading(template, rubric, hints=DEFAULT_HINTS):
    """GRADING.md: @MARKS@ becomes what the assignment is worth, @ITEMS@ the rubric's table,
    @PROMPTS_GIVE@ what the prompts give at hint level `hints`."""
    template = fill_in(template, "@PROMPTS_GIVE@", PROMPTS_GIVE[hints])
    rows = ["| task | item | marks | what the tests check | what a reader judges |",
            "| --- | --- | --- | --- | --- |"]
    rows += [f"| {number} | `{item.id}`: {item.title} | {item.marks:g} | "
             f"{'nothing: a person grades it' if by_person(item) else item.checks} | "
             f"{item.needs_human} |" for number, item in enumerate(rubric.ITEMS, start=1)]
    return template.replace("@MARKS@", marks(rubric)).replace("@ITEMS@", "\n".join(rows))
