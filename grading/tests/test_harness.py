"""The launcher of student code (grading/launch.py): a launch shared by several tests runs once,
and one that failed fails the others at once; a child's error comes back as its traceback, its
result only as data."""
import os
import pickle
import shutil
import tempfile

import pytest
import torch

from grading import sandbox
from grading.launch import ChildFailed, LaunchFailed, launch_once, run_alone, run_python


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


WHO_AM_I = """import os, sys
print(os.getuid(), os.getcwd())
print(os.access(sys.argv[1], os.W_OK), file=sys.stderr)
sys.exit(3)
"""


def test_a_script_forked_from_the_warm_server_runs_as_the_child_user_in_the_sandbox(
        monkeypatch, tmp_path):
    # run_python forks scripts from the server that has imported torch: each must still run as a
    # fresh `python` under grade.py would, as the test's child user, in the sandbox
    if os.geteuid() != 0:
        pytest.skip("only root changes users")
    scratch = tempfile.mkdtemp()
    os.chmod(scratch, 0o711)
    uid = 2**24 + 2
    monkeypatch.setattr(sandbox, "SCRATCH", scratch)
    monkeypatch.setattr(sandbox.Child, "uid", uid)
    monkeypatch.setattr(sandbox.Child, "handed_over", [])
    monkeypatch.setattr(sandbox.Child, "home", sandbox.hand_over(tempfile.mkdtemp(dir=scratch)))
    script = os.path.join(scratch, "who_am_i.py")
    with open(script, "w") as file:
        file.write(WHO_AM_I)
    os.chmod(script, 0o644)
    try:
        done = run_python([script, tmp_path])
    finally:
        sandbox.settle()
        shutil.rmtree(scratch)
    assert done.returncode == 3, done.stderr
    assert done.stdout.split() == [str(uid), sandbox.SANDBOX]
    assert done.stderr.strip() == "False"  # the judge's folder is not the child's to write
