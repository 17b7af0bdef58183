"""Render the design document, design_doc/*.md, from its templates and the results folder.

    python -m analysis.build_design_doc           # results/ -> design_doc/*.md and numbers.json
    python -m analysis.build_design_doc --check   # exit 1 if the committed document is stale
    python -m analysis.build_design_doc --results-dir /tmp/r --out-dir /tmp/doc

Each design_doc/templates/*.md becomes design_doc/*.md with every `{{ name }}` replaced by a number
(formatted with its unit), a table or a figure; data tables become CSV files beside it;
numbers.json records every number a reader sees and where it came from (design_numbers.py). An
undefined placeholder fails the build; a missing run renders as "not measured"."""
import argparse
import glob
import json
import math
import os
import pathlib
import re
import sys

from analysis import (
    design_benchmarks,
    design_emulated,
    design_end_to_end,
    design_fits,
    design_numbers,
    design_performance,
    design_scaling,
    design_sections,
    design_sharding,
    results_folder,
)
from analysis.design_numbers import NOT_MEASURED, REPO, BuildError, Numbers, repo_relative
from runtime.atomic import write_atomic

TEMPLATES = os.path.join(REPO, "design_doc", "templates")
PLACEHOLDER = re.compile(r"\{\{\s*([\w.\-]+)\s*\}\}")
# make_handout.py's solution regions and the prompts students see in their place: shown in neither
MARKERS = re.compile(r"^<!-- BEGIN PROMPT\n.*?^END PROMPT -->\n"
                     r"|^<!-- (?:BEGIN|END) SOLUTION[^\n]*-->\n", re.M | re.S)
ABOUT = "every number a reader sees, with its provenance: see design_doc/README.md"
RELATIVE_TOLERANCE = 1e-9  # above two machines' fits (2.5e-13 apart), far below a 0.1 % change
# tables of data (per size, rank or repeat): CSV files beside the document, linked in their place
DATA_TABLES = tuple(f"table.{name}" for name in (
    "fits.ring predict step_bench step_bench_verdict bucket_sweep "
    "sweep.mlp sweep.cnn comm.mlp comm.cnn buckets.mlp buckets.cnn crossover "
    "emulated.training.mlp emulated.training.cnn sharding.side.mlp sharding.side.cnn "
    "sharding.memory.mlp sharding.memory.cnn sharding.bytes sharding.prefetch").split())


def required_results(results_dir):
    """The sweep's and bucket sweep's runs (never pooled), worlds above one, the all-reduce file."""
    if not os.path.isdir(results_dir):
        raise BuildError(f"results folder {results_dir} not found: run python -m analysis.sweep "
                         "and python -m benchmarks.allreduce_bench")
    runs, _ = results_folder.load_folder(results_dir, note=lambda note: None)
    grouped = results_folder.repeats(runs, "sweep")
    worlds = sorted({world for _, _, world, _ in grouped if world > 1})
    if not worlds:
        raise BuildError(f"no training runs with more than one rank in {results_dir} "
                         f"(schema {results_folder.SCHEMA}): run python -m analysis.sweep")
    bench = os.path.join(results_dir, "allreduce-bench.json")
    if not os.path.exists(bench):
        raise BuildError(f"{bench} not found: run python -m benchmarks.allreduce_bench "
                         "(the cost model is fitted to it)")
    return grouped, results_folder.repeats(runs, "bucket"), worlds, bench


def as_data(context):
    """{CSV file name: its text} of each of DATA_TABLES that is a table, which `context` links."""
    for name in DATA_TABLES:
        lines = [line for line in context.get(name, "").splitlines()
                 if line.startswith("|") and not line.startswith("|---")]
        if lines:
            file_name = name.removeprefix("table.").replace(".", "-").replace("_", "-") + ".csv"
            rows = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
            context.update(design_numbers.data_file(name, file_name, rows[0], rows[1:], file_name))
    return {name: context.pop(name) for name in list(context) if name.endswith(".csv")}


def render(context, numbers, templates):
    """{file name: text} of the templates filled from `context` and `numbers`, and the CSV files."""
    csv_files = as_data(context)
    context["syntax.placeholder"] = "`{{ name }}`"
    context.update({name: NOT_MEASURED for name in numbers.absent})
    context.update({name: entry["text"] for name, entry in numbers.entries.items()})
    documents = {}
    for name, text in templates.items():
        text = MARKERS.sub("", text)
        unknown = sorted({key for key in PLACEHOLDER.findall(text) if key not in context})
        if unknown:
            raise BuildError(f"{name} uses {', '.join(unknown)}, which the build does not define")
        documents[name] = PLACEHOLDER.sub(lambda match: context[match.group(1)], text)
    return {**documents, **csv_files}


def build(results_dir, out_dir):
    """{file name: text} of the whole document: the rendered sections, CSVs and numbers.json."""
    design_numbers.loaded.clear()
    grouped, bucket_runs, worlds, bench = required_results(results_dir)
    numbers = Numbers()
    layouts = design_sections.model_facts(numbers)
    context = design_performance.sweep_section(numbers, grouped, worlds)
    fits, tables = design_fits.allreduce_section(numbers, bench)
    mlp_bucket_mbs = {bucket_mb for model, _, _, bucket_mb in bucket_runs if model == "mlp"}
    design_sections.trace_section(numbers, results_dir)
    for part in (tables,  # in the order the numbers are registered, which numbers.json keeps
                 design_sections.communication_section(numbers, layouts, worlds, mlp_bucket_mbs,
                                                        results_dir),
                 design_fits.prediction_section(numbers, layouts, worlds, fits, results_dir),
                 design_benchmarks.step_bench_section(numbers, results_dir),
                 design_performance.bucket_sweep_section(numbers, bucket_runs),
                 # the emulated link's fit first: the projections draw a 1 Gbit/s link with it
                 design_emulated.emulated_section(numbers, results_dir, layouts),
                 design_scaling.projection_section(numbers, results_dir, layouts),
                 design_sections.main_job_section(numbers, results_dir),
                 design_end_to_end.time_to_accuracy_section(numbers, results_dir),
                 design_end_to_end.gpu_section(numbers, results_dir),
                 # after §5's fits: the projection sends its bytes at their links' speeds
                 design_sharding.sharding_section(numbers, results_dir),
                 design_sections.provenance_section(numbers, results_dir),
                 design_sections.figures(results_dir, out_dir)):
        context.update(part)
    paths = sorted(glob.glob(os.path.join(TEMPLATES, "*.md")))
    templates = {os.path.basename(path): pathlib.Path(path).read_text() for path in paths}
    return {**render(context, numbers, templates),
            "numbers.json": numbers_json(numbers, results_dir, templates)}


def numbers_json(numbers, results_dir, templates):
    """The numbers seen and those they derive from, each formula once; a line an entry (diffs)."""
    seen, new = set(), set(numbers.shown).union(*map(PLACEHOLDER.findall, templates.values()))
    while new:  # the names just seen, then the numbers they are derived from
        seen |= new
        new = {source for name in new
               for source in numbers.entries.get(name, {}).get("inputs", [])} - seen
    entries = {name: dict(entry) for name, entry in numbers.entries.items() if name in seen}
    sources, ids = {}, {}
    for entry in entries.values():
        if entry.get("file"):  # provenance as a reader at the repository's root
            entry["file"] = repo_relative(entry["file"])
        if "inputs" in entry:
            inputs = [source if "#" not in source else
                      f"{repo_relative(source.split('#')[0])}#{source.split('#')[1]}"
                      for source in entry.pop("inputs")]
            source = {"formula": entry.pop("formula"), "inputs": inputs}
            identity = ids.setdefault(json.dumps(source, sort_keys=True), f"s{len(ids) + 1}")
            sources[identity] = source
            entry["derived_from"] = identity
            del entry["kind"]  # derived: derived_from says so
    document = {"about": ABOUT, "results_dir": repo_relative(results_dir), "numbers": entries,
                "sources": sources, "not_measured": sorted(seen.intersection(numbers.absent))}
    line = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode  # µ and × kept
    parts = [f" {line(key)}: {line(value)}" if not isinstance(value, dict) else
             f" {line(key)}: {{\n" + ",\n".join(f"  {line(name)}: {line(item)}"
                                                 for name, item in value.items()) + "\n }"
             for key, value in document.items()]
    return "{\n" + ",\n".join(parts) + "\n}\n"


def same_json(old, new):
    """Whether two decoded JSON documents are equal, their numbers within RELATIVE_TOLERANCE."""
    if isinstance(old, float) or isinstance(new, float):
        return (isinstance(old, (int, float)) and isinstance(new, (int, float))
                and math.isclose(old, new, rel_tol=RELATIVE_TOLERANCE))
    if isinstance(old, list) and isinstance(new, list):  # as a dict of its indices
        old, new = dict(enumerate(old)), dict(enumerate(new))
    if isinstance(old, dict) and isinstance(new, dict):
        return old.keys() == new.keys() and all(same_json(old[key], new[key]) for key in old)
    return old == new


def differences(documents, out_dir):
    """The files missing from `out_dir` or unlike `documents`; numbers.json at its precision."""
    def same(name, text):
        path = pathlib.Path(out_dir, name)
        decode = json.loads if name.endswith(".json") else str
        return path.exists() and same_json(decode(path.read_text()), decode(text))
    return [name for name, text in documents.items() if not same(name, text)]


def main(argv=None):
    """Build the document; write it, or with --check compare it with the committed one."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results-dir", default="results")
    parser.add_argument("--out-dir", default=os.path.join(REPO, "design_doc"))
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed one differs")
    args = parser.parse_args(argv)
    try:
        documents = build(args.results_dir, args.out_dir)
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    changed = differences(documents, args.out_dir)
    if args.check:
        if changed:
            print(f"design document out of date: {len(changed)} of {len(documents)} files differ "
                  f"from a build from {args.results_dir}: {', '.join(changed)}; "
                  "rebuild with python -m analysis.build_design_doc", file=sys.stderr)
            return 1
        print(f"design document up to date with {args.results_dir} ({len(documents)} files)")
        return 0
    absent = json.loads(documents["numbers.json"])["not_measured"]
    if absent:  # each is said where it is shown, with the command that would measure it
        print(f"note: {len(absent)} numbers are not measured (numbers.json's not_measured)")
    for name in changed:  # the others are left as they are: a rebuild elsewhere changes nothing
        write_atomic(os.path.join(args.out_dir, name),  # whole or not at all
                     lambda file, text=documents[name]: file.write(text))
    print(f"wrote {len(changed)} of {len(documents)} files to {args.out_dir} from "
          f"{args.results_dir} (the others were the same)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
