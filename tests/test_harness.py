"""The tests' own harness (tests/harness.py): a launch shared by several tests runs once, and one
that failed fails the others at once."""
import pytest

from tests.harness import LaunchFailed, launch_once


def test_a_shared_launch_runs_once_per_arguments_and_a_failed_one_is_not_started_again():
    calls = []

    @launch_once
    def outcomes(world_size):
        calls.append(world_size)
        if world_size == 3:
            raise RuntimeError("Traceback ...\nNotImplementedError: Task 3: the ring")
        return {"world_size": world_size}

    assert outcomes(2) == outcomes(2) == {"world_size": 2}
    # the first test to need the failed launch sees its error...
    with pytest.raises(RuntimeError, match="Task 3"):
        outcomes(3)
    # ...every later one fails at once, naming the launch and the error's last line
    for _ in range(2):
        with pytest.raises(LaunchFailed, match=r"outcomes\(3,\) failed in an earlier test: "
                                               r"NotImplementedError: Task 3: the ring"):
            outcomes(3)
    assert calls == [2, 3]
