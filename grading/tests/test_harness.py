"""The launcher of student code (grading/launch.py): a launch shared by several tests runs once,
and one that failed fails the others at once; a child's error comes back as its traceback, its
result only as data."""
import os
import pickle

import pytest
import torch

from grading.launch import ChildFailed, LaunchFailed, launch_once, run_alone


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


# What a handout's unfinished region raises (held in a name: the handout's checks count that
# raise statement in task files only).
UNFINISHED = "Task 1: the MLP's layers"


def raises_in_the_child():
    raise NotImplementedError(UNFINISHED)


def returns_what_pickle_would_run():
    return {"fine": torch.ones(2), "not data": os.system}


def test_a_childs_error_comes_back_as_its_own_traceback_and_only_data_comes_back():
    with pytest.raises(ChildFailed, match=r"(?s)in raises_in_the_child.*NotImplementedError: "
                                          r"Task 1: the MLP's layers"):
        run_alone(raises_in_the_child)
    # a function is code, not data: torch.load(weights_only=True) refuses it in the parent
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        run_alone(returns_what_pickle_would_run)
