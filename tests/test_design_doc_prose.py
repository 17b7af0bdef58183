"""The committed design document as a reader meets it: within its budgets, and no generated phrase
broken across a line."""
import glob
import os
import re

import pytest

from grading.launch import SANDBOX

pytestmark = pytest.mark.rubric("design.numbers")

DOCUMENT = os.path.join(SANDBOX, "design_doc")
WORD_BUDGET = 8000  # words of design_doc/*.md, counted as wc -w counts them
NUMBERS_BUDGET = 1_000_000  # bytes of numbers.json
# a number (or a number and 'and', 'to', a dash) at a line's end, a number at the next one's start
BROKEN = re.compile(r"\d[\d.,]*(?:\s*(?:and|to|or|–|-))?\n\s*\d")
# a word twice in a row: a template's word beside a number that carries the same unit
DOUBLED = re.compile(r"\b([A-Za-z]+)\s+\1\b")


def sections():
    """{file name: text} of the committed document's Markdown files."""
    texts = {}
    for path in sorted(glob.glob(os.path.join(DOCUMENT, "*.md"))):
        with open(path) as file:
            texts[os.path.basename(path)] = file.read()
    return texts


def prose(text):
    """The text without code blocks and table rows: where a line break is a sentence's."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return "\n".join(line for line in text.splitlines() if not line.startswith("|"))


def broken_phrases(text):
    """Every place where a line ends inside a generated phrase such as '1 and\\n1'."""
    return BROKEN.findall(prose(text))


def test_a_line_break_inside_a_generated_phrase_is_found():
    # the sentence the old template made: numbers on both sides of a line end
    assert broken_phrases("Buckets per step: DDP 1 and\n1, ZeRO-2 1 and\n1.") != []
    assert broken_phrases("from 0.5 to\n2.1 ms") != []
    # a break between words, or a number that ends a sentence, is a person's
    assert broken_phrases("DDP sends 1 bucket per step for the MLP\nand 1 for the CNN.") == []
    assert broken_phrases("| 1 and |\n| 2 |") == []


def test_no_sentence_of_the_document_is_broken_inside_a_generated_phrase():
    for name, text in sections().items():
        assert broken_phrases(text) == [], name


def test_no_word_of_the_document_comes_twice_in_a_row():
    assert DOUBLED.findall(prose("fits from 45 ranks ranks, and")) == ["ranks"]
    for name, text in sections().items():
        assert DOUBLED.findall(prose(text)) == [], name


def test_the_document_stays_within_its_word_budget():
    words = sum(len(text.split()) for text in sections().values())
    assert words <= WORD_BUDGET, f"{words} words"


def test_numbers_json_stays_under_a_megabyte():
    assert os.path.getsize(os.path.join(DOCUMENT, "numbers.json")) <= NUMBERS_BUDGET


def test_every_section_opens_with_its_answer():
    for name, text in sections().items():
        if name in ("README.md", "6-appendix.md"):
            continue
        for section in re.split(r"^## ", text, flags=re.M)[1:]:
            body = [line for line in section.splitlines()[1:] if line.strip()]
            assert body and body[0].startswith("**Answer.**"), (name, section.splitlines()[0])
