"""Solution regions: where the solution's code and prose are, and what students see instead.

In Python a region is a block of whole lines at one indentation, after its prompt:

    # BEGIN PROMPT
    # What to write: comment lines, which the student sees.
    # END PROMPT
    # BEGIN SOLUTION Task 3: per-parameter sync
    ...the solution...
    # END SOLUTION

In Python the prompt may be left out where the docstring above is the specification. The handout
keeps the prompt's comment lines and puts `raise NotImplementedError("Task 3:
per-parameter sync")` in place of the rest, at the region's indentation. In Markdown (the design
document's templates) the markers are HTML comments, invisible in the solution's rendered document:

    <!-- BEGIN PROMPT
    What to write.
    END PROMPT -->
    <!-- BEGIN SOLUTION Task 5: the modules -->
    ...the solution's prose...
    <!-- END SOLUTION -->

and the handout shows the prompt as a quotation: `> **Task 5: the modules.** What to write.`
"Task N" is the rubric's N-th item; the label after the colon is optional (the item's title by
default). A marker that is misspelt, nested, unclosed or out of place is a MarkerError naming the
file and the line.

A prompt opens with its contract: what must hold when the code returns, and the interface. Hints
may follow in two layers, each opened by a line of its own, which the instructor keeps or drops
(make_handout.py --hints; HINT_LEVELS):

    # BEGIN PROMPT
    # The contract, always shown.
    # HINTS outline
    # The approach in a sentence or two: shown at --hints outline and steps.
    # HINTS steps
    # Step by step: shown at --hints steps only.
    # END PROMPT
"""
import io
import json
import re
import textwrap
import tokenize
from typing import NamedTuple

# The exact markers. Anything else that looks like one is an error: it was meant as a marker.
PYTHON = {"BEGIN PROMPT": "# BEGIN PROMPT", "END PROMPT": "# END PROMPT",
          "END SOLUTION": "# END SOLUTION"}
PYTHON_BEGIN = (re.compile(r"# BEGIN SOLUTION Task (\d+)(?:: (\S.*))?"),
                "# BEGIN SOLUTION Task N[: label]")
MARKDOWN = {"BEGIN PROMPT": "<!-- BEGIN PROMPT", "END PROMPT": "END PROMPT -->",
            "END SOLUTION": "<!-- END SOLUTION -->"}
MARKDOWN_BEGIN = (re.compile(r"<!-- BEGIN SOLUTION Task (\d+)(?:: (\S.*?))? -->"),
                  "<!-- BEGIN SOLUTION Task N[: label] -->")
LOOKS_LIKE_A_MARKER = re.compile(r"\b(BEGIN|END)|(?i:\b(begin|end)[\s_]*(solution|prompt))")
ANYWHERE = re.compile(r"^\s*(#+|<!--)\s*(BEGIN|END) (SOLUTION|PROMPT)")  # in other files
# How much of each prompt the student sees: the contract alone, and each hint layer up to one.
HINT_LEVELS = ("none", "outline", "steps")
DEFAULT_HINTS = "outline"  # the approach, not the lines: the code is then the student's own
HINT_MARKER = re.compile(r"HINTS? *(\S*)")  # "HINTS outline" or "HINTS steps", as a prompt line
HINT_HEADINGS = {"outline": "The approach:", "steps": "Step by step:"}  # in the marker's place


class MarkerError(Exception):
    """A solution marker that cannot be read, as `path:line: what is wrong`."""

    def __init__(self, path, line, message):
        super().__init__(f"{path}:{line}: {message}")


class Marker(NamedTuple):
    """One marker line: its kind, and for BEGIN SOLUTION its task and label."""
    kind: str  # "BEGIN PROMPT", "END PROMPT", "BEGIN SOLUTION" or "END SOLUTION"
    task: int = 0
    label: str = ""


class Region(NamedTuple):
    """One solution region of a file; line indices count from 0."""
    path: str
    task: int
    label: str  # "" where the marker gives none
    prompt_start: int  # the BEGIN PROMPT line
    start: int  # the BEGIN SOLUTION line
    end: int  # the END SOLUTION line
    prompt: list  # the prompt's lines as written
    indent: str  # the markers' indentation
    where: str  # Class.function in Python, the section's heading in Markdown
    layers: dict  # {hint level: the prompt's lines it adds}: hint_layers'


def read_marker(path, number, text, exact, begin):
    """The Marker that `text` (a comment, or a Markdown line, stripped) is; None if it is no
    marker; a MarkerError if it looks like one but is not exactly one. `begin`: the pattern of
    BEGIN SOLUTION and its form as the error message shows it."""
    for kind, form in exact.items():
        if text == form:
            return Marker(kind)
    pattern, begin_form = begin
    match = pattern.fullmatch(text)
    if match:
        return Marker("BEGIN SOLUTION", int(match.group(1)), match.group(2) or "")
    if LOOKS_LIKE_A_MARKER.search(text):
        forms = ", ".join(f"'{form}'" for form in (begin_form, *exact.values()))
        raise MarkerError(path, number, f"misspelt marker '{text}': the markers are {forms}")
    return None


def python_markers(path, text):
    """{line index: Marker} of a Python file, from its comments (never from inside a string)."""
    lines = text.split("\n")
    markers = {}
    try:
        comments = [token for token in tokenize.generate_tokens(io.StringIO(text).readline)
                    if token.type == tokenize.COMMENT]
    except (tokenize.TokenError, SyntaxError) as error:
        line = error.args[1][0] if isinstance(error, tokenize.TokenError) else error.lineno
        raise MarkerError(path, line, f"not valid Python: {error.args[0]}") from None
    for token in comments:
        row, column = token.start
        if not token.string.startswith("#") or not LOOKS_LIKE_A_MARKER.match(
                token.string.lstrip("#").strip()):
            continue
        if lines[row - 1][:column].strip():
            raise MarkerError(path, row, "a marker must be a line of its own, not a comment after "
                                         "code")
        marker = read_marker(path, row, token.string.rstrip(), PYTHON, PYTHON_BEGIN)
        if marker:
            markers[row - 1] = marker
    return markers


def markdown_markers(path, lines):
    """{line index: Marker} of a Markdown file; fenced code blocks hold no markers."""
    markers = {}
    fenced = False
    for index, line in enumerate(lines):
        text = line.strip()
        if text.startswith("```"):
            fenced = not fenced
        elif not fenced and ("<!--" in text or "-->" in text):
            marker = read_marker(path, index + 1, text, MARKDOWN, MARKDOWN_BEGIN)
            if marker:
                markers[index] = marker
    return markers


def find_regions(path, text, tasks):
    """The solution regions of a .py or .md file, in order. `tasks`: the number of rubric items
    (Task 1 to Task `tasks` exist). Raises MarkerError for a marker out of place."""
    lines = text.split("\n")
    python = path.endswith(".py")
    markers = python_markers(path, text) if python else markdown_markers(path, lines)
    regions = []
    state = "outside"
    opened = None  # the line index of the marker that opened the current prompt or region
    for index, line in enumerate(lines):
        marker = markers.get(index)
        number = index + 1
        if state == "prompt":
            if marker is None:
                check_prompt_line(path, number, line, python, opened)
                continue
            if marker.kind != "END PROMPT":
                raise MarkerError(path, number, f"{marker.kind} inside the prompt opened at line "
                                                f"{opened + 1}: markers cannot be nested")
            state = "after prompt"
        elif state == "after prompt":
            if marker is None or marker.kind != "BEGIN SOLUTION":
                raise MarkerError(path, number, "END PROMPT must be followed at once by "
                                                "BEGIN SOLUTION Task N")
            check_task(path, number, marker, tasks)
            prompt_start, begin, state = opened, (index, marker), "solution"
        elif state == "solution":
            if marker is None:
                continue
            if marker.kind != "END SOLUTION":
                raise MarkerError(path, number, f"{marker.kind} inside the solution region opened "
                                                f"at line {begin[0] + 1}: regions cannot be nested")
            if index == begin[0] + 1:
                raise MarkerError(path, number, "an empty solution region")
            regions.append(make_region(path, lines, prompt_start, begin, index))
            state = "outside"
        elif marker is not None:
            if marker.kind == "BEGIN PROMPT":
                state, opened = "prompt", index
            elif marker.kind == "BEGIN SOLUTION" and python:
                # no prompt: the docstring above is the specification
                check_task(path, number, marker, tasks)
                prompt_start, begin, state = index, (index, marker), "solution"
            elif marker.kind == "BEGIN SOLUTION":
                raise MarkerError(path, number, "BEGIN SOLUTION without a prompt before it "
                                                "(BEGIN PROMPT ... END PROMPT)")
            else:
                opening = marker.kind.replace("END", "BEGIN")
                raise MarkerError(path, number, f"{marker.kind} without {opening}")
    if state != "outside":
        start = begin[0] if state == "solution" else opened
        what = "BEGIN SOLUTION" if state == "solution" else "BEGIN PROMPT"
        raise MarkerError(path, start + 1, f"unclosed {what}: no END before the end of the file")
    return regions


def check_task(path, number, marker, tasks):
    """A region's task must be a rubric item."""
    if not 1 <= marker.task <= tasks:
        raise MarkerError(path, number, f"Task {marker.task} is not a rubric item "
                                        f"(Task 1 to Task {tasks})")


def check_prompt_line(path, number, line, python, opened):
    """A prompt's line must be a comment (Python) or plain text inside the comment (Markdown)."""
    if python and not line.lstrip().startswith("#"):
        raise MarkerError(path, number, f"the prompt opened at line {opened + 1} holds a line that "
                                        "is not a comment (unclosed: no END PROMPT?)")
    if not python and ("<!--" in line or "-->" in line):
        raise MarkerError(path, number, f"the prompt opened at line {opened + 1} closes its "
                                        "comment before END PROMPT -->")


def make_region(path, lines, prompt_start, begin, end):
    """The Region from its marker lines; in Python every marker at one indentation."""
    start, marker = begin
    indent = indentation(lines[start])
    if path.endswith(".py"):
        prompt = (prompt_start, start - 1, *range(prompt_start + 1, start - 1))
        for index in (start, end, *(prompt if prompt_start < start else ())):
            if indentation(lines[index]) != indent:
                raise MarkerError(path, index + 1, "the markers and the prompt of a region must "
                                                   f"share the indentation of line {start + 1}")
    prompt = lines[prompt_start + 1:start - 1] if prompt_start < start else []
    return Region(path, marker.task, marker.label, prompt_start, start, end, prompt, indent,
                  enclosing(path, lines, start), hint_layers(path, prompt_start + 2, prompt))


def hint_layers(path, first_number, prompt):
    """{level: lines} of a prompt: its contract under "none", each hint layer under its level.
    `first_number`: the prompt's first line's number, for a MarkerError naming a wrong marker."""
    layers = {level: [] for level in HINT_LEVELS}
    level = "none"
    for number, line in enumerate(prompt, start=first_number):
        text = line.strip().lstrip("#").strip()
        match = HINT_MARKER.fullmatch(text)
        if match is None:
            layers[level].append(line)
            continue
        name = match.group(1)
        later = HINT_LEVELS[HINT_LEVELS.index(level) + 1:]
        if name not in later or text != f"HINTS {name}":
            raise MarkerError(path, number, f"'{line.strip()}': the hint markers are 'HINTS "
                                            "outline' then 'HINTS steps', each once, in order")
        if not any(text.strip("# ") for text in layers["none"]):
            raise MarkerError(path, number, "a prompt opens with its contract, before its hints")
        level = name
        layers[level].append(line.replace(f"HINTS {name}", HINT_HEADINGS[name]))
    return layers


def shown_prompt(region, hints):
    """The lines of the region's prompt the student sees at hint level `hints`."""
    levels = HINT_LEVELS[:HINT_LEVELS.index(hints) + 1]
    return [line for level in levels for line in region.layers[level]]


def indentation(line):
    """The whitespace a line begins with."""
    return line[:len(line) - len(line.lstrip())]


def enclosing(path, lines, index):
    """Where line `index` is: Class.function in Python, the heading above it in Markdown."""
    if not path.endswith(".py"):
        return next((line.lstrip("#").strip() for line in reversed(lines[:index])
                     if line.startswith("#")), "")
    names = []
    indent = len(lines[index]) - len(lines[index].lstrip())
    for line in reversed(lines[:index]):
        match = re.match(r"(\s*)(?:async\s+)?(?:def|class)\s+(\w+)", line)
        if match and len(match.group(1)) < indent:
            names.insert(0, match.group(2))
            indent = len(match.group(1))
    return ".".join(names) or "module level"


def student_lines(region, titles, hints=DEFAULT_HINTS):
    """What the student sees in the region's place: its prompt at hint level `hints`, and 'Task
    N: label' (the item's title where the marker gives no label) raised in Python, in bold in
    Markdown."""
    message = f"Task {region.task}: {region.label or titles[region.task - 1]}"
    prompt = shown_prompt(region, hints)
    if region.path.endswith(".py"):
        raise_line = f"{region.indent}raise NotImplementedError({json.dumps(message)})"
        return prompt + [raise_line]
    prompt = " ".join(line.strip() for line in prompt)
    return ["> " + line for line in textwrap.wrap(f"**{message}.** {prompt}", 97)]


def replace_regions(text, regions, titles, hints=DEFAULT_HINTS):
    """`text` with every region (of this file, in order) replaced by what the student sees at
    hint level `hints`."""
    lines = text.split("\n")
    for region in reversed(regions):
        lines[region.prompt_start:region.end + 1] = student_lines(region, titles, hints)
    return "\n".join(lines)


def stray_marker(path, text):
    """A MarkerError for a marker in a file that is neither Python nor Markdown, else None."""
    for index, line in enumerate(text.split("\n")):
        if ANYWHERE.match(line):
            return MarkerError(path, index + 1, "solution regions are read only in .py and .md "
                                                "files")
    return None
