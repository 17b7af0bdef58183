"""When and under what load each results file was made, as the files record it: design_doc's
provenance.csv (one row a file) and the README's sentence on it. Training runs record their
creation time only; the benchmarks also the 1-minute load average when they started."""
import glob
import os

from analysis.design_numbers import data_file, load, repo_relative

LOAD = "environment.load_average_1min_at_start"


def recorded(path):
    """(created, load average at start) of a results file; None where it records none."""
    document = load(path)
    if not isinstance(document, dict):
        return None, None
    load_average = document.get("environment", {}).get("load_average_1min_at_start")
    return document.get("created"), load_average


def provenance_section(numbers, results_dir):
    """'provenance.csv' and the numbers the README quotes: the first and last creation time, the
    days they span, and the least and greatest load average recorded."""
    paths = sorted(glob.glob(os.path.join(results_dir, "**", "*.json"), recursive=True))
    rows, dated, loaded = [], [], []
    for path in paths:
        created, load_average = recorded(path)
        rows.append([repo_relative(path), created or "not recorded",
                     "not recorded" if load_average is None else f"{load_average:.2f}"])
        if created:
            dated.append((created, path))
        if load_average is not None:
            loaded.append((load_average, path))
    for name, chosen in (("first", min(dated, default=None)), ("last", max(dated, default=None))):
        numbers.measured(f"provenance.{name}", chosen and chosen[1], "created", "name")
    for name, chosen in (("load_low", min(loaded, default=None)),
                         ("load_high", max(loaded, default=None))):
        numbers.measured(f"provenance.{name}", chosen and chosen[1], LOAD, "number")
    days = sorted({created[:10] for created, _ in dated})
    numbers.add("provenance.days", len(days) or None, "count", kind="derived",
                inputs=[f"{path}#created" for _, path in dated],
                formula="distinct dates among the files' creation times")
    numbers.stated("provenance.files", len(paths), "count", "code",
                   f"the *.json files under {repo_relative(results_dir)}")
    numbers.stated("provenance.undated", len(paths) - len(dated), "count", "code",
                   "the files that record no creation time")
    return data_file("link.provenance", "provenance.csv",
                     ["file", "created", "load average (1 min) at start"], rows,
                     "provenance.csv")
