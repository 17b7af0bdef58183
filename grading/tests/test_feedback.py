"""What a student reads when a test fails: the difference first (rank, chunk, index, expected and
actual within the failure's first lines, under the student's pytest options), each error's
traceback once, and the marks table as the output's last block."""
import shlex

import pytest

from grading.handout.build import STUDENT_ADDOPTS
from grading.tests.test_grading import RUBRIC, grade, write

pytest_plugins = ["pytester"]

STUDENT_OPTIONS = shlex.split(STUDENT_ADDOPTS.split("=", 1)[1].strip().strip('"'))


@pytest.fixture(autouse=True)
def no_installed_plugins(monkeypatch):
    """The generated suites need none (pytester forgets the modules a run imported)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


# A ring reduce-scatter with the mistake a student makes: what arrives is added into the chunk
# just sent, the neighbour's, not the next one; every rank simulated in one process.
PLANTED = """
import torch

from tests.test_sharding import check_reduce_scatter

WORLD_SIZE = 3


def ring_reduce_scatter_into_the_wrong_chunk(tensors):
    n = len(tensors)
    chunks = [tensor.clone().view(n, -1) for tensor in tensors]
    for step in range(n - 1):
        sent = [chunks[rank][(rank - step - 1) % n].clone() for rank in range(n)]
        for rank in range(n):
            chunks[rank][(rank - step - 1) % n].add_(sent[(rank - 1) % n])  # not (rank - step - 2)
    return [chunks[rank][rank] for rank in range(n)]


def test_ring_reduce_scatter_equals_the_librarys():
    tensors = [torch.arange(6, dtype=torch.float32) * (rank + 1) for rank in range(WORLD_SIZE)]
    library = sum(tensors).view(WORLD_SIZE, -1)
    outputs = ring_reduce_scatter_into_the_wrong_chunk(tensors)
    for rank, output in enumerate(outputs):
        cases = {("float32", "integers", 6): {"reduce_scatter": (output, library[rank]),
                                              "largest_sum": 30.0}}
        check_reduce_scatter(rank, cases, "float32", WORLD_SIZE)
"""


def failure_lines(lines, name):
    """The lines of `name`'s failure in pytest's FAILURES section, its header first."""
    start = next(index for index, line in enumerate(lines) if name in line and "___" in line)
    end = next((index for index in range(start + 1, len(lines))
                if lines[index].startswith(("___", "===="))), len(lines))
    return lines[start:end]


def test_a_wrong_chunk_in_the_reduce_scatter_fails_with_rank_chunk_index_and_values_first(
        pytester):
    write(pytester, "test_planted.py", PLANTED)
    result = pytester.runpytest("-p", "no:cacheprovider", "-W",
                                "ignore::pytest.PytestUnknownMarkWarning", *STUDENT_OPTIONS,
                                "test_planted.py")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    first_five = "\n".join(failure_lines(result.outlines, "test_ring_reduce_scatter")[:5])
    # rank 0's chunk 0 should hold 1 + 2 + 3 at index 1; the mistake left its own 1 there
    for said in ("rank 0", "chunk 0", "index 1", "expected 6", "got 1"):
        assert said in first_five, first_five


def test_the_marks_table_is_the_last_block_after_pytests_summary(pytester):
    result, _, _ = grade(pytester, """
        import pytest

        @pytest.mark.rubric("core.model")
        def test_model_learns(): pass

        @pytest.mark.rubric("core.sync")
        def test_sync_sums_by_mistake(): assert 1 == 2
    """, "-ra", rubric=RUBRIC)
    lines = [line for line in result.outlines if line.strip()]
    table = max(index for index, line in enumerate(lines) if "= rubric =" in line)
    summary = next(index for index, line in enumerate(lines) if "short test summary" in line)
    counts = next(index for index, line in enumerate(lines) if "1 failed, 1 passed" in line)
    assert summary < counts < table, lines
    # after the table's heading: its items, the total and where the report went, nothing else
    assert [line.split()[0] for line in lines[table + 1:]] == [
        "core.model", "core.sync", "doc.timing", "total:", "grade", ], lines[table:]


def test_tests_failing_with_the_same_error_show_its_traceback_once(pytester):
    result, _, _ = grade(pytester, """
        import pytest

        def ring_all_reduce(tensor):
            raise NotImplementedError("Task 6: the ring all-reduce")

        @pytest.mark.rubric("core.sync")
        @pytest.mark.parametrize("world_size", [1, 2, 3])
        def test_ring(world_size): ring_all_reduce(world_size)

        @pytest.mark.rubric("core.sync")
        @pytest.mark.parametrize("rank", [0, 1])
        def test_a_childs_error(rank):  # as tests/test_sharding.py reports a rank's error
            pytest.fail(f"rank {rank} raised:\\nTraceback\\nNotImplementedError: Task 11: ZeRO",
                        pytrace=False)

        @pytest.fixture
        def launch():  # as tests/harness.launch_once reports a launch that failed before
            raise RuntimeError("launch(2) failed in an earlier test: NotImplementedError: Task 6: "
                               "the ring all-reduce")

        @pytest.mark.rubric("core.sync")
        @pytest.mark.parametrize("world_size", [2, 3])
        def test_ring_again(launch, world_size): pass

        @pytest.mark.rubric("core.model")
        def test_model_learns(): assert 1 == 2
    """, "-ra", "--tb=short", rubric=RUBRIC)
    output = result.stdout.str()
    shown = output[output.index("= ERRORS ="):output.index(" short test summary info ")]
    # the first of Task 6's five (in ERRORS, which pytest prints first) in full, once
    assert shown.count("raise RuntimeError") == 1, shown
    assert "4 more tests failed with it" in shown
    assert "ring_all_reduce(world_size)" not in shown  # the failures' tracebacks left out
    # pytest prints every error in set-up: a repeat there shrinks to a line naming the first
    assert shown.count("NotImplementedError: Task 6: the ring all-reduce (as in "
                       "test_graded.py::test_ring_again[2], shown in full)") == 1, shown
    failures = output[output.index("= FAILURES ="):output.index(" short test summary info ")]
    assert failures.count("NotImplementedError: Task 11") == 1, failures
    assert "1 more test failed with it" in failures
    assert "assert 1 == 2" in failures  # another error keeps its own
    # each still counted, and listed in the summary
    assert output.count("FAILED test_graded.py::test_ring") == 3
    assert output.count("ERROR test_graded.py::test_ring_again") == 2
    assert "6 failed" in output and "2 errors" in output
