"""The registry of every number the design document quotes: its value, how it is shown, and where
it came from."""
import csv
import io
import json
import math
import os
import re

from analysis import results_folder
from analysis.results_folder import spread

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_MEASURED = "not measured"


class BuildError(Exception):
    """A problem with the inputs that the user can fix; reported as one line."""


# --- Results files, read once per build, and how their numbers are shown --------------------

loaded = {}  # path -> parsed JSON, read once per build


def load(path):
    """The parsed JSON of a results file, read once per build."""
    if path not in loaded:
        try:
            with open(path) as file:
                loaded[path] = json.load(file)
        except ValueError as error:
            raise BuildError(f"{path} is not valid JSON ({error}); "
                             "re-run the command that wrote it") from None
    return loaded[path]


def lookup(data, field):
    """`data` at a path such as 'timing.across_ranks.step.median' or 'measurements[3].median_s';
    None if absent."""
    for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", field):
        try:
            data = data[int(index)] if index else data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def significant(value, digits=3):
    """`value` to `digits` significant figures: fixed-point with thousands separators, or
    e-notation if tiny."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) < 1e-4:
        return f"{value:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def show_bytes(value):
    """'512 B', '2.27 MB': bytes in B, kB or MB (powers of 1000)."""
    if value < 1e3:
        return f"{value:,.0f} B"
    if value < 1e6:
        return significant(value / 1e3) + " kB"
    return significant(value / 1e6) + " MB"


def show_seconds(value):
    """Seconds in s, ms or µs, whichever keeps the number readable."""
    if value >= 1:
        return significant(value) + " s"
    if value >= 1e-4:
        return significant(value * 1e3) + " ms"
    return significant(value * 1e6) + " µs"


def show_percent(value):
    """A fraction as a percentage: two significant figures below 10%, three above, and none below
    0.005 %, where a fit's error is the floating point's rounding, not a measurement."""
    if 0 < abs(value) < 5e-5:
        return "0.00%"
    return significant(100 * value, 2 if abs(value) < 0.1 else 3) + "%"


def show_ranks(value):
    """A world size, or that none up to 2^20 reaches it (cost_model.crossover_world_size's 0)."""
    return f"{value:,} ranks" if value else "beyond 2^20 ranks"


UNITS = {  # unit -> how a value in that unit is shown
    "s": show_seconds,
    "ms": lambda value: significant(value * 1e3) + " ms",
    "us": lambda value: significant(value * 1e6) + " µs",
    "trace_us": lambda value: significant(value / 1e3) + " ms",
    "bytes": show_bytes,
    "bytes-list": lambda values: " + ".join(map(show_bytes, values)),
    "GB": lambda value: significant(value / 1e9) + " GB",
    "MiB": lambda value: f"{value:g} MiB",
    "MiB-list": lambda values: ", ".join(f"{value:g}" for value in values) + " MiB",
    "GB/s": lambda value: significant(value) + " GB/s",
    "Gbit/s": lambda value: f"{value:g} Gbit/s",
    "ns/byte": lambda value: significant(value * 1e9) + " ns/byte",
    "percent": show_percent,
    "round-percent": lambda value: f"{100 * value:g}%",
    "ratio": lambda value: significant(value) + "×",
    "round-ratio": lambda value: f"{value:g}×",
    "count": lambda value: f"{value:,}",
    "number": significant,
    "exact": lambda value: f"{value:g}",
    "samples/s": lambda value: significant(value) + " samples/s",
    "name": str,
    "exponent": lambda value: f"2^{round(math.log2(value))}",
    "ranks": show_ranks,
}


# --- Formulas that derived numbers apply to their inputs ---------------------------------------

def unchanged(value):
    """The value itself: an alias of another number, and over_repeats' default `combine`."""
    return value


def ratio(numerator, denominator):
    """numerator / denominator."""
    return numerator / denominator


def smallest(*values):
    """The smallest of the values."""
    return min(values)


def largest(*values):
    """The largest of the values."""
    return max(values)


def mean(*values):
    """The arithmetic mean of the values."""
    return sum(values) / len(values)


# --- The registry -------------------------------------------------------------------------------

class Numbers:
    """Every number the document quotes: value, unit, the text a reader sees, and where it came
    from."""

    def __init__(self):
        self.entries = {}  # name -> {value, unit, text, provenance...}
        self.absent = []  # names of numbers whose inputs are missing: "not measured"
        self.shown = set()  # names whose text the build gave out: numbers a reader sees

    def add(self, name, value, unit, **provenance):
        """Register `name`; a None value is absent (not measured)."""
        if value is None:
            self.absent.append(name)
        else:
            self.entries[name] = {"value": value, "unit": unit, "text": UNITS[unit](value),
                                  **provenance}
        return value

    def measured(self, name, path, field, unit):
        """The value of `field` in the results file `path` (absent without the file or field)."""
        value = lookup(load(path), field) if path else None
        return self.add(name, value, unit, kind="measured", file=path, field=field)

    def derived(self, name, function, inputs, unit, formula):
        """`function(*values)` of `inputs`, each a registered name or 'file#field'; absent if any
        input is."""
        def as_fields(*values):
            return {"": function(*values)}
        return self.derived_fields(name, as_fields, inputs, {"": unit}, formula)[""]

    def input_value(self, source):
        """The value of a registered name, or of 'file#field' in a results file."""
        if "#" not in source:
            return self.value(source)
        path, field = source.split("#")
        return lookup(load(path), field)

    def derived_fields(self, key, function, inputs, units, formula):
        """`key.<field>` for each field of the dict that `function(*values)` returns (just `key`
        for field "")."""
        values = [self.input_value(source) for source in inputs]
        result = {} if None in values or not inputs else function(*values)
        return {field: self.add(f"{key}.{field}".rstrip("."), result.get(field), unit,
                                kind="derived", formula=formula, inputs=inputs)
                for field, unit in units.items()}

    def stated(self, name, value, unit, kind, source):
        """A number from the models, the code, an assumption or a publication."""
        return self.add(name, value, unit, kind=kind, source=source)

    def over_repeats(self, key, runs, fields, unit, combine=unchanged, formula="the field"):
        """`key.median`, `.min`, `.max`, `.n`: results_folder.spread over the repeated `runs` of
        `combine(*fields)`, each field a JSON path of one run's file (absent without runs)."""
        fields = (fields,) if isinstance(fields, str) else tuple(fields)
        inputs = [f"{run['path']}#{field}" for run in runs for field in fields]
        width = len(fields)

        def over_runs(*values):
            per_run = [combine(*values[start:start + width])
                       for start in range(0, len(values), width)]
            return spread([value for value in per_run if value is not None]) or {}
        units = {"median": unit, "min": unit, "max": unit, "n": "count"}
        return self.derived_fields(key, over_runs, inputs, units,
                                   f"results_folder.spread over the repeats of {formula}")

    def paired_ratio(self, key, runs, others, field, unit="ratio", scale=1.0, formula="ratio"):
        """`key.median`, `.min`, `.max`, `.n` and the interval `.low`, `.high` the verdict reads
        (results_folder.interval): `field` of each of `runs` over the same field of the run of
        `others` made in the same round (results_folder.paired), times `scale`. A ratio within
        one round, never across rounds or sweeps; absent unless both have runs."""
        pairs = results_folder.paired(runs, others)
        inputs = [f"{run['path']}#{field}" for pair in pairs for run in pair]
        return self.paired_values(key, inputs, unit, scale,
                                  f"{formula}, within each round; spread and interval over rounds")

    def paired_values(self, key, inputs, unit, scale, formula, already_ratios=False):
        """paired_ratio's numbers over `inputs`: mine, theirs, mine, theirs... one pair a round;
        or, `already_ratios`, one ratio a round."""
        def over_rounds(*values):
            pairs = [(value, 1) for value in values] if already_ratios else zip(values[0::2],
                                                                                 values[1::2])
            ratios = [scale * mine / theirs for mine, theirs in pairs if theirs]
            if not ratios:
                return {}
            low, high = results_folder.interval(ratios)
            return dict(spread(ratios), low=low, high=high)
        units = {"median": unit, "min": unit, "max": unit, "n": "count", "low": unit,
                 "high": unit}
        return self.derived_fields(key, over_rounds, inputs, units, formula)

    def spread_text(self, key):
        """'median (min–max)' as a reader sees it, the unit written once ('7.49 ms (7.05–7.60)');
        just the median for one run."""
        if self.value(f"{key}.median") is None:
            return NOT_MEASURED
        self.shown.add(f"{key}.n")
        median = self.text(f"{key}.median")
        if self.value(f"{key}.n") == 1:
            return median + " (one run)"
        low, high = self.text(f"{key}.min"), self.text(f"{key}.max")
        unit = re.search(r"[^\d.,]*$", median).group()  # ' ms', '%', '×', ' samples/s'
        if unit and low.endswith(unit) and high.endswith(unit):
            low, high = low.removesuffix(unit), high.removesuffix(unit)
        return f"{median} ({low}–{high})"

    def verdict(self, name, ratios):
        """'faster', 'slower' or 'indistinguishable' by the document's one rule
        (results_folder.verdict) over `ratios`, a key registered by paired_ratio (first / second
        within each round)."""
        return self.derived(name, results_folder.verdict, [f"{ratios}.low", f"{ratios}.high"],
                            "name", "results_folder.verdict: faster or slower only where every "
                            "paired ratio agrees, or a bootstrap interval over 5 or more rounds "
                            "excludes 1")

    def claim(self, ratios, verdict):
        """'0.95× (0.93–0.97), faster': a paired ratio's spread and its verdict."""
        if self.value(verdict) is None:
            return NOT_MEASURED
        return f"{self.spread_text(ratios)}, {self.text(verdict)}"

    def value(self, name):
        """The value registered as `name`, or None."""
        return self.entries.get(name, {}).get("value")

    def text(self, name):
        """How `name` reads in the document: its text, or 'not measured'."""
        self.shown.add(name)
        return self.entries[name]["text"] if name in self.entries else NOT_MEASURED


def data_file(name, file_name, header, rows, caption):
    """{file_name: the rows as CSV, name: a Markdown link to it}: a table that serves as data sits
    beside the document, built by the same command."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return {file_name: text.getvalue(), name: f"[{caption}]({file_name})"}


def table(header, rows):
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def repo_relative(path):
    """`path` as the document records it: relative to the repository when inside it, so that a
    build from any working directory, or with an absolute --results-dir, writes the same
    document."""
    relative = os.path.relpath(os.path.abspath(path), REPO)
    return os.path.abspath(path) if relative.startswith("..") else relative

