"""The registry of every number the design document quotes: its value, the text a reader sees,
and where it came from (a results file's field, a formula over other numbers, the code or an
assumption)."""
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
SPREAD_UNITS = ("median", "min", "max")


class BuildError(Exception):
    """A problem with the inputs that the user can fix; reported as one line."""


loaded = {}  # path -> parsed JSON


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


def read_results(path, schema, command):
    """(the document at `path`, None) if it is of `schema`, else ({}, a note saying what to run)."""
    document = load(path) if os.path.exists(path) else {}
    if document.get("schema") == schema:
        return document, None
    if not document:
        return {}, f"*No {repo_relative(path)}: run {command}.*"
    return {}, (f"*{repo_relative(path)} is of schema {document.get('schema')!r}, not {schema}: "
                f"run {command} again.*")


def indices_by(rows, *fields):
    """{(row[field] for each of `fields`): the indices of the rows with those values}."""
    found = {}
    for index, row in enumerate(rows):
        found.setdefault(tuple(row[field] for field in fields), []).append(index)
    return found


def lookup(data, field):
    """`data` at a path such as 'measurements[3].median_s'; None if absent."""
    for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", field):
        try:
            data = data[int(index)] if index else data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def significant(value, digits=3):
    """Fixed-point with thousands separators to `digits` significant figures; e-notation if tiny."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) < 1e-4:
        return f"{value:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:,.{decimals}f}"


def show_seconds(value):
    """'1.2 s', '3.45 ms', '120 µs'."""
    if value >= 1:
        return significant(value) + " s"
    return significant(value * 1e3) + " ms" if value >= 1e-4 else significant(value * 1e6) + " µs"


def show_bytes(value):
    """'512 B', '4.10 kB', '2.27 MB': powers of 1000."""
    if value < 1e3:
        return f"{value:,.0f} B"
    return significant(value / 1e6) + " MB" if value >= 1e6 else significant(value / 1e3) + " kB"


def show_percent(value):
    """Two significant figures below 10%, three above; 0.00% below 0.005 %, a fit's rounding."""
    if 0 < abs(value) < 5e-5:
        return "0.00%"
    return significant(100 * value, 2 if abs(value) < 0.1 else 3) + "%"


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
    "count": lambda value: f"{value:,}",
    "number": significant,
    "exact": lambda value: f"{value:g}",
    "samples/s": lambda value: significant(value) + " samples/s",
    "name": str,
    "exponent": lambda value: f"2^{round(math.log2(value))}",
    # cost_model.crossover_world_size's 0: no world size reaches it
    "ranks": lambda value: f"{value:,} ranks" if value else "beyond 2^20 ranks",
}


def unchanged(value):
    return value  # an alias of another number


class Numbers:
    """Every number the document quotes: value, unit, text and provenance."""

    def __init__(self):
        self.entries = {}  # name -> {value, unit, text, provenance...}
        self.absent = []  # names whose inputs are missing: "not measured"
        self.shown = set()  # names whose text the build gave out: numbers a reader sees

    def add(self, name, value, unit, **provenance):
        """Register `name`; a None value is absent."""
        if value is None:
            self.absent.append(name)
        else:
            self.entries[name] = {"value": value, "unit": unit, "text": UNITS[unit](value),
                                  **provenance}
        return value

    def measured(self, name, path, field, unit):
        """`field` of the results file `path` (absent without the file or field)."""
        value = lookup(load(path), field) if path else None
        return self.add(name, value, unit, kind="measured", file=path, field=field)

    def stated(self, name, value, unit, kind, source):
        """A number from the models, the code or an assumption."""
        return self.add(name, value, unit, kind=kind, source=source)

    def derived(self, name, function, inputs, unit, formula):
        """`function(*values)` of `inputs`, each a registered name or 'file#field'."""
        return self.derived_fields(name, lambda *values: {"": function(*values)}, inputs,
                                   {"": unit}, formula)[""]

    def derived_fields(self, key, function, inputs, units, formula):
        """`key.<field>` of each field of the dict `function(*values)` (`key` for field ""); all
        absent if any input is, or there are none."""
        values = [self.value(source) if "#" not in source
                  else lookup(load(source.split("#")[0]), source.split("#")[1])
                  for source in inputs]
        result = {} if None in values or not inputs else function(*values)
        return {field: self.add(f"{key}.{field}".rstrip("."), result.get(field), unit,
                                kind="derived", formula=formula, inputs=inputs)
                for field, unit in units.items()}

    def spread_of(self, key, inputs, unit, formula, combine=unchanged, width=1):
        """`key.median`, `.min`, `.max`, `.n` over the repeats, each `combine` of `width`
        consecutive inputs (one repeat's); Nones left out."""
        def over_repeats(*values):
            per_repeat = [combine(*values[start:start + width])
                          for start in range(0, len(values), width)]
            return spread([value for value in per_repeat if value is not None]) or {}
        units = {**dict.fromkeys(SPREAD_UNITS, unit), "n": "count"}
        return self.derived_fields(key, over_repeats, inputs, units,
                                   f"results_folder.spread over the repeats of {formula}")

    def over_repeats(self, key, runs, fields, unit, combine=unchanged, formula="the field"):
        """spread_of `combine(*fields)` of each of the repeated `runs` (absent without runs)."""
        fields = (fields,) if isinstance(fields, str) else tuple(fields)
        inputs = [f"{run['path']}#{field}" for run in runs for field in fields]
        return self.spread_of(key, inputs, unit, formula, combine, len(fields))

    def paired_ratio(self, key, runs, others, field, unit="ratio", scale=1.0, formula="ratio"):
        """paired_values of `field` of each of `runs` over the run of `others` of the same round."""
        pairs = results_folder.paired(runs, others)
        inputs = [f"{run['path']}#{field}" for pair in pairs for run in pair]
        return self.paired_values(key, inputs, unit, scale,
                                  f"{formula}, within each round; spread and interval over rounds")

    def paired_values(self, key, inputs, unit, scale, formula, already_ratios=False):
        """`key.median`, `.min`, `.max`, `.n` and the verdict's interval `.low`, `.high` of
        `scale` x mine / theirs over `inputs` (a pair a round), or one ratio a round."""
        def over_rounds(*values):
            pairs = [(value, 1) for value in values] if already_ratios else zip(values[0::2],
                                                                                 values[1::2])
            ratios = [scale * mine / theirs for mine, theirs in pairs if theirs]
            if not ratios:
                return {}
            low, high = results_folder.interval(ratios)
            return dict(spread(ratios), low=low, high=high)
        units = {**dict.fromkeys(SPREAD_UNITS, unit), "n": "count", "low": unit, "high": unit}
        return self.derived_fields(key, over_rounds, inputs, units, formula)

    def spread_text(self, key):
        """'7.49 ms (7.05–7.60)': the median and the range, the unit once; '(one run)' alone."""
        self.shown.update([f"{key}.median", f"{key}.n"])
        if self.value(f"{key}.median") is None:
            return NOT_MEASURED
        median = self.text(f"{key}.median")
        if self.value(f"{key}.n") == 1:
            return median + " (one run)"
        low, high = self.text(f"{key}.min"), self.text(f"{key}.max")
        unit = re.search(r"[^\d.,]*$", median).group()  # ' ms', '%', '×', ' samples/s'
        if unit and low.endswith(unit) and high.endswith(unit):
            low, high = low.removesuffix(unit), high.removesuffix(unit)
        return f"{median} ({low}–{high})"

    def verdict(self, name, ratios):
        """results_folder.verdict of the interval of `ratios` (registered by paired_values)."""
        return self.derived(name, results_folder.verdict, [f"{ratios}.low", f"{ratios}.high"],
                            "name", "results_folder.verdict: faster or slower only where every "
                            "paired ratio agrees, or a bootstrap interval over 5 or more rounds "
                            "excludes 1")

    def claim(self, ratios, verdict):
        """'0.95× (0.93–0.97), faster'."""
        if self.value(verdict) is None:
            return NOT_MEASURED
        return f"{self.spread_text(ratios)}, {self.text(verdict)}"

    def value(self, name):
        return self.entries.get(name, {}).get("value")  # None if absent

    def text(self, name):
        """How `name` reads in the document; marks it as shown."""
        self.shown.add(name)
        return self.entries[name]["text"] if name in self.entries else NOT_MEASURED


def data_file(name, file_name, header, rows, caption):
    """{file_name: the rows as CSV, name: a Markdown link to it}."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerows([header, *rows])
    return {file_name: text.getvalue(), name: f"[{caption}]({file_name})"}


def cells(numbers, columns, **fields):
    """A row of `columns` ((header, name template, Numbers.text or Numbers.spread_text)), each
    template filled from `fields`."""
    return [show(numbers, template.format(**fields)) for _, template, show in columns]


def headers(columns):
    return [header for header, *_ in columns]  # of cells' columns


def table(header, rows):
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def repo_relative(path):
    """`path` relative to the repository if inside it: any working directory builds the same."""
    relative = os.path.relpath(os.path.abspath(path), REPO)
    return os.path.abspath(path) if relative.startswith("..") else relative
