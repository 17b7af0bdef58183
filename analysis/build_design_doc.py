"""Render the design document, design_doc/*.md, from its templates and the results folder.

    python -m analysis.build_design_doc                  # results/ -> design_doc/*.md and design_doc/numbers.json
    python -m analysis.build_design_doc --check          # exit 1 if the committed document is not what a build gives
    python -m analysis.build_design_doc --results-dir /tmp/r --out-dir /tmp/doc

Each design_doc/templates/*.md becomes design_doc/*.md with every `{{ name }}` replaced by a number
(formatted with its unit), a table or a figure. Every number is registered with where it came from:
a field of a results file (measured), a formula over numbers or fields (derived), the alpha-beta fit
of a results file, the models or the code, a stated assumption or a publication (cost_model.py);
numbers.json lists them all. A placeholder the build does not define fails the build; a run that is
missing renders as "not measured". Needs the sweep's training runs and results/allreduce-bench.json;
step-bench.json, bucket-*.json, trace-*.json and plots/*.png are used when present. Training runs
are read by results.load_folder and grouped by results.repeats, as the plots read them.
What §1-§3 say is in design_sections.py, §4's measurements in design_performance.py, the α-β
fits and projections in design_scaling.py (over cost_model.py); the registry of numbers and their
formatting in design_numbers.py.
"""
import argparse
import difflib
import glob
import json
import os
import re
import sys

from analysis import design_numbers
from analysis.design_numbers import NOT_MEASURED, REPO, BuildError, Numbers, shown  # noqa: F401 (BuildError: for callers)
from analysis.design_performance import (
    bucket_sweep_section,
    prediction_section,
    step_bench_section,
    sweep_section,
)
from analysis.design_scaling import allreduce_section, projection_section
from analysis.design_sections import (
    DEFAULT_BUCKET_MB,
    bucketed_first_bucket_mb,
    communication_section,
    figures,
    main_job_section,
    model_facts,
    reference_commands,
    trace_section,
)
from runtime import results

TEMPLATES = os.path.join(REPO, "design_doc", "templates")
PLACEHOLDER = re.compile(r"\{\{\s*([\w.\-]+)\s*\}\}")


def required_results(results_dir):
    """The training runs grouped by configuration, their world sizes above one, and the all-reduce benchmark's
    path; or what to run."""
    if not os.path.isdir(results_dir):
        raise BuildError(f"results folder {results_dir} not found: "
                         "run python -m analysis.sweep and python -m benchmarks.allreduce_bench")
    runs, _ = results.load_folder(results_dir, note=lambda line: None)
    grouped = results.repeats(runs)
    worlds = sorted({world for _, _, world, _ in grouped if world > 1})
    if not worlds:
        raise BuildError(f"no training runs with more than one rank in {results_dir} (schema {results.SCHEMA}): "
                         "run python -m analysis.sweep")
    bench = os.path.join(results_dir, "allreduce-bench.json")
    if not os.path.exists(bench):
        raise BuildError(f"{bench} not found: run python -m benchmarks.allreduce_bench (the cost model is fitted to it)")
    return grouped, worlds, bench


def render(context):
    """{file name: text} of every template with its placeholders filled from `context`."""
    documents = {}
    for path in sorted(glob.glob(os.path.join(TEMPLATES, "*.md"))):
        with open(path) as file:
            text = file.read()
        unknown = sorted({name for name in PLACEHOLDER.findall(text) if name not in context})
        if unknown:
            raise BuildError(f"{os.path.basename(path)} uses {', '.join(unknown)}, which the build does not define")
        documents[os.path.basename(path)] = PLACEHOLDER.sub(lambda match: context[match.group(1)], text)
    return documents


def build(results_dir, out_dir):
    """{file name: text} of the whole document: the rendered sections and numbers.json."""
    design_numbers.loaded.clear()
    grouped, worlds, bench = required_results(results_dir)
    n = Numbers()
    layouts, first = model_facts(n), bucketed_first_bucket_mb(n)
    bucket_mbs = sorted({mb for model, _, _, mb in grouped if model == "mlp"} | {DEFAULT_BUCKET_MB})
    context = sweep_section(n, grouped, worlds)
    fits, tables = allreduce_section(n, bench)
    for part in (tables, communication_section(n, layouts, worlds, bucket_mbs, first),
                 prediction_section(n, layouts, worlds, fits, first), trace_section(n, results_dir),
                 step_bench_section(n, results_dir), bucket_sweep_section(n, grouped),
                 projection_section(n, layouts, first), main_job_section(n, results_dir), reference_commands(n),
                 figures(results_dir, out_dir)):
        context.update(part)
    context["syntax.placeholder"] = "`{{ name }}`"
    context.update({name: NOT_MEASURED for name in n.absent})
    context.update({name: entry["text"] for name, entry in n.entries.items()})
    documents = render(context)
    for entry in n.entries.values():  # provenance as a reader at the repository's root follows it
        if entry.get("file"):
            entry["file"] = shown(entry["file"])
        if "inputs" in entry:
            entry["inputs"] = [shown(i.split("#")[0]) + "#" + i.split("#")[1] if "#" in i else i for i in entry["inputs"]]
    documents["numbers.json"] = json.dumps({
        "about": "every number in the design document: its value, the text shown, and where it came from "
                 "(measured: file + JSON field; derived: formula + inputs, each a number's name or file#field; "
                 "fit: the file the alpha-beta model was fitted to; model/code: how it was computed; "
                 "assumption: a constant of cost_model.py; publication: the paper; file: a results file's name)",
        "results_dir": shown(results_dir), "numbers": n.entries, "not_measured": sorted(set(n.absent))},
        indent=1, ensure_ascii=False) + "\n"
    return documents


def differences(documents, out_dir):
    """'name (k lines)' for each file whose committed text differs from `documents` ('missing' if absent)."""
    changed = []
    for name, text in documents.items():
        path = os.path.join(out_dir, name)
        old = open(path).read() if os.path.exists(path) else None
        if old != text:
            diff = difflib.unified_diff((old or "").splitlines(), text.splitlines(), lineterm="", n=0)
            lines = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))
            changed.append(f"{name} ({'missing' if old is None else f'{lines} lines'})")
    return changed


def missing_optional(results_dir):
    """One line per optional input that is absent: the document says "not measured" or what to run there."""
    wanted = {"step-bench.json": "python -m benchmarks.step_bench", "bucket-*.json": "python -m analysis.sweep",
              "trace-*.json": "python mlp_ddp.py ... --trace (see design_doc/README.md)",
              os.path.join("plots", "*.png"): "python -m analysis.plots"}
    return [f"note: no {os.path.join(results_dir, pattern)}; the document says so where it would be used ({command})"
            for pattern, command in wanted.items() if not glob.glob(os.path.join(results_dir, pattern))]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--out-dir", default=os.path.join(REPO, "design_doc"))
    parser.add_argument("--check", action="store_true", help="compare with the committed document; exit 1 if it differs")
    args = parser.parse_args(argv)
    try:
        documents = build(args.results_dir, args.out_dir)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.check:
        changed = differences(documents, args.out_dir)
        if changed:
            print(f"design document out of date: {len(changed)} of {len(documents)} files differ from a build from "
                  f"{args.results_dir}: {', '.join(changed)}; rebuild with python -m analysis.build_design_doc", file=sys.stderr)
            return 1
        print(f"design document up to date with {args.results_dir} ({len(documents)} files)")
        return 0
    print("\n".join(missing_optional(args.results_dir)) or "every optional input is present")
    os.makedirs(args.out_dir, exist_ok=True)
    for name, text in documents.items():
        with open(os.path.join(args.out_dir, name), "w") as file:
            file.write(text)
    print(f"wrote {len(documents)} files to {args.out_dir} from {args.results_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
