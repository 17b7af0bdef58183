"""torch left as it is: importing any module of the project replaces no function of
torch.distributed and registers no hook on every optimizer or module. What a run adds around the
collectives it composes as layers (runtime/collective_record.py, runtime/timing.py); its one
interception, of the point-to-point messages, is the launcher's, said in the run's first lines."""
import json
import os
import subprocess
import sys

from tests.harness import REPO

LEFT_OUT = {"tests", os.path.join("grading", "tests")}  # the tests' own helpers may intercept

# In a fresh interpreter: torch's own objects, every module of the project imported, then what
# differs. Printed as JSON: the names replaced, and the global hook registries that gained one.
CHECK = """
import importlib, json, sys
import torch
import torch.distributed as dist
from torch.nn.modules import module
from torch.optim import optimizer

def public(namespace):
    return {name: value for name, value in vars(namespace).items()
            if not name.startswith("_") and callable(value)}

def registries():
    found = {name: len(value) for name, value in vars(optimizer).items()
             if name.startswith("_global_optimizer_")}
    found.update({name: len(value) for name, value in vars(module).items()
                  if name.startswith("_global_") and isinstance(value, dict)})
    return found

before = {"dist": public(dist), "c10d": public(dist.distributed_c10d)}
hooks = registries()
for name in sys.argv[1:]:
    importlib.import_module(name)
replaced = [f"{space}.{name}" for space, functions in before.items() for name, function in
            functions.items() if getattr(getattr(dist, "distributed_c10d") if space == "c10d"
                                         else dist, name) is not function]
print(json.dumps({"replaced": replaced,
                  "hooks": {name: count for name, count in registries().items()
                            if count != hooks[name]}}))
"""


def project_modules():
    """The dotted name of every .py file of the project, but the tests'."""
    names = []
    for folder, subfolders, files in os.walk(REPO):
        relative = os.path.relpath(folder, REPO)
        subfolders[:] = sorted(name for name in subfolders if not name.startswith(".")
                               and name != "__pycache__"
                               and os.path.normpath(os.path.join(relative, name)) not in LEFT_OUT)
        for file in sorted(files):
            if file.endswith(".py"):
                path = os.path.normpath(os.path.join(relative, file))
                names.append(path[:-3].replace(os.sep, ".").removesuffix(".__init__"))
    return names


def test_the_walk_finds_the_lesson_the_runtime_and_the_grader():
    found = set(project_modules())
    assert {"mlp_ddp", "manual_sharding", "runtime.collective_record", "runtime.timing",
            "grading.launch", "benchmarks.step_bench"} <= found
    assert not any(name.startswith("tests.") or ".tests." in name for name in found)


def test_importing_every_module_of_the_project_leaves_torch_distributed_and_its_hooks_alone():
    done = subprocess.run([sys.executable, "-c", CHECK, *project_modules()], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    changed = json.loads(done.stdout.strip().splitlines()[-1])
    # every public function of torch.distributed is still torch's own
    assert changed["replaced"] == [], changed["replaced"]
    # and no optimizer or module hook applies to every instance
    assert changed["hooks"] == {}, changed["hooks"]
