"""The student's README.md and GRADING.md, from their templates: the tasks' order and marks from
the rubric, the timing definitions from the solution's README, so neither can drift from what is
graded or measured. The solution's own README and GRADING.md are the instructor's."""
from handout.assignment import marks

TIMING = "## Timing: what the numbers mean"  # the README section the student's copy keeps


def section(markdown, heading):
    """The section of `markdown` that starts with the line `heading`, up to the next `## `; empty
    where there is none (a checkout without the README)."""
    if heading + "\n" not in markdown:
        return ""
    start = markdown.index(heading + "\n")
    end = markdown.find("\n## ", start + len(heading))
    return markdown[start:end if end >= 0 else len(markdown)].rstrip() + "\n"


def readme(template, rubric, solution_readme):
    """README.md: @ORDER@ becomes the tasks with the command that checks each, @TIMING@ the
    solution README's timing definitions."""
    order = "\n".join(f"{number}. Task {number}, {item.title} ({item.marks:g} marks): "
                      f"`python -m pytest -k {item.id}`"
                      for number, item in enumerate(rubric.ITEMS, start=1))
    timing = section(solution_readme, TIMING)
    return template.replace("@ORDER@", order).replace("@TIMING@", timing.rstrip())


def grading(template, rubric):
    """GRADING.md: @MARKS@ becomes what the assignment is worth, @ITEMS@ the rubric's table."""
    rows = ["| task | item | marks | what the tests check | what a reader judges |",
            "| --- | --- | --- | --- | --- |"]
    rows += [f"| {number} | `{item.id}`: {item.title} | {item.marks:g} | {item.checks} | "
             f"{item.needs_human} |" for number, item in enumerate(rubric.ITEMS, start=1)]
    return template.replace("@MARKS@", marks(rubric)).replace("@ITEMS@", "\n".join(rows))
