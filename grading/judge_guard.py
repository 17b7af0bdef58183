"""A pytest plugin for the judge (grade.py loads it): every function and method the task modules
define raises in this process, the code given around the solution regions too, so that no verdict
rests on code that ran in the process deciding it.
"""
import importlib
import inspect

from grading.profile import TASK_FILES


class TaskCodeInTheJudge(RuntimeError):
    """A test called the assignment's code in the process that decides the grade."""


def refuse(name):
    def refused(*args, **kwargs):
        raise TaskCodeInTheJudge(f"{name} was called in the judge's process: the tests call the "
                                 "assignment's code only in child processes (grading/launch.py)")
    return refused


def guard(module_name):
    """Replace every function and method defined in `module_name` by refuse()."""
    module = importlib.import_module(module_name)
    for name, value in list(vars(module).items()):
        if getattr(value, "__module__", None) != module_name:
            continue  # imported from elsewhere (torch, the standard library)
        if inspect.isfunction(value):
            setattr(module, name, refuse(f"{module_name}.{name}"))
        elif inspect.isclass(value):
            for attribute, member in list(vars(value).items()):
                if inspect.isfunction(member):
                    setattr(value, attribute, refuse(f"{module_name}.{name}.{attribute}"))


for path in TASK_FILES:
    guard(path[:-len(".py")].replace("/", "."))
