"""runtime/'s modules import one another in layers: no circle, and no project module imported
inside a function, where an import hides a circle until the function runs."""
import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
RUNTIME = REPO / "runtime"
PROJECT = {path.stem for path in REPO.glob("*.py")} | {"runtime", "analysis", "benchmarks",
                                                       "handout", "slurm", "tests"}


def imported_modules(node):
    """The dotted names an Import or ImportFrom node brings in (a package's names included)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative imports: none in this project, but say so if one appears
        return [f"relative:{node.module}"]
    return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]


def runtime_module(name):
    """`name` as a module of runtime/ ("runtime.timing"), or None."""
    parts = name.split(".")
    if parts[0] == "runtime" and len(parts) > 1 and (RUNTIME / f"{parts[1]}.py").exists():
        return f"runtime.{parts[1]}"
    return None


def parsed(path):
    return ast.parse(path.read_text(), filename=str(path))


def runtime_graph():
    """{runtime module: the runtime modules it imports, anywhere in it}."""
    graph = {}
    for path in sorted(RUNTIME.glob("*.py")):
        imports = set()
        for node in ast.walk(parsed(path)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.update(filter(None, map(runtime_module, imported_modules(node))))
        graph[f"runtime.{path.stem}"] = imports
    return graph


def find_cycle(graph):
    """One circle of `graph` as a list of modules (the first repeated at the end), or None."""
    state = {}  # module -> "open" while on the path being walked, "done" after

    def visit(module, path):  # path: from where the walk started to `module`
        state[module] = "open"
        for other in sorted(graph.get(module, ())):
            if state.get(other) == "open":
                return path[path.index(other):] + [other]
            if other not in state and (found := visit(other, path + [other])):
                return found
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return None


def function_level_project_imports(path):
    """'file:line module' of each project module imported inside a function of `path`."""
    found = []
    for function in ast.walk(parsed(path)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [name for name in imported_modules(node)
                         if name.split(".")[0] in PROJECT or name.startswith("relative:")]
                if names:
                    found.append(f"{path.name}:{node.lineno} {names[0]}")
    return found


def test_runtime_imports_form_no_circle():
    graph = runtime_graph()
    # the wrappers, for one, are among the modules read: the graph is not trivially empty
    assert "runtime.manual_ddp" in graph["runtime.wrappers"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_no_function_in_runtime_imports_a_project_module():
    found = [entry for path in sorted(RUNTIME.glob("*.py"))
             for entry in function_level_project_imports(path)]
    assert found == []


def test_the_checks_find_a_circle_and_a_hidden_import(tmp_path):
    # the checks themselves, on a graph and a file made to fail them
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    hidden = tmp_path / "late.py"
    hidden.write_text("import torch\n\n\ndef late():\n    from runtime import wrappers\n")
    assert function_level_project_imports(hidden) == ["late.py:5 runtime"]
