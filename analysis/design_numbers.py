"""The registry of every number the design document quotes: its value, the text a reader sees and
where it came from (a results file's field, a formula over others, the code or an assumption)."""
import csv
import io
import json
import math
import os
import re

from analysis import results_folder

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_MEASURED = "not measured"
SPREAD_UNITS = ("median", "min", "max")
loaded = {}  # path -> parsed JSON, cleared by each build


class BuildError(Exception):
    """A problem with the inputs that the user can fix; reported as one line."""


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


def paired_by_repeat(path, rows, field, mine, theirs):
    """Inputs for Numbers.paired_values: 'path#measurements[i].field' of `mine`'s row, then of
    `theirs`', for each repeat both have (`mine`, `theirs`: indices into `rows`)."""
    sides = [{rows[index]["repeat"]: index for index in indices} for indices in (mine, theirs)]
    return [f"{path}#measurements[{side[repeat]}].{field}"
            for repeat in sorted(set(sides[0]) & set(sides[1])) for side in sides]


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


UNITS = {  # unit -> how a value in that unit is shown
    "s": lambda value: (significant(value) + " s" if value >= 1
                        else significant(value * 1e3) + " ms" if value >= 1e-4
                        else significant(value * 1e6) + " µs"),
    "ms": lambda value: significant(value * 1e3) + " ms",
    "us": lambda value: significant(value * 1e6) + " µs",
    "trace_us": lambda value: significant(value / 1e3) + " ms",
    "bytes": lambda value: (f"{value:,.0f} B" if value < 1e3  # powers of 1000
                            else significant(value / 1e6) + " MB" if value >= 1e6
                            else significant(value / 1e3) + " kB"),
    "bytes-list": lambda values: " + ".join(map(UNITS["bytes"], values)),
    "GB": lambda value: significant(value / 1e9) + " GB",
    "MiB": lambda value: f"{value:g} MiB",
    "MiB-list": lambda values: ", ".join(f"{value:g}" for value in values) + " MiB",
    "GB/s": lambda value: significant(value) + " GB/s",
    "Gbit/s": lambda value: f"{value:g} Gbit/s",
    "ns/byte": lambda value: significant(value * 1e9) + " ns/byte",
    "percent": lambda value: ("0.00%" if 0 < abs(value) < 5e-5  # below a fit's rounding
                              else significant(100 * value, 2 if abs(value) < 0.1 else 3) + "%"),
    "round-percent": lambda value: f"{100 * value:g}%",
    "ratio": lambda value: significant(value) + "×",
    "count": lambda value: f"{value:,}",
    "number": significant,
    "exact": lambda value: f"{value:g}",
    "samples/s": lambda value: significant(value) + " samples/s",
    "name": str,
    "exponent": lambda value: f"2^{round(math.log2(value))}",
    "ranks": lambda value: f"{value:,} ranks" if value else "beyond 2^20 ranks",  # 0: no crossover
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
            self.entries[name] = dict(value=value, unit=unit, text=UNITS[unit](value), **provenance)
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
        """`key.<field>` of each field of the dict `function(*values)` (`key` for field "")."""
        values = [self.value(source) for source in inputs]
        result = {} if None in values or not inputs else function(*values)  # {}: all absent
        return {field: self.add(f"{key}.{field}".rstrip("."), result.get(field), unit,
                                kind="derived", formula=formula, inputs=inputs)
                for field, unit in units.items()}

    def spread_of(self, key, inputs, unit, formula, combine=unchanged, width=1):
        """`key.median`, `.min`, `.max`, `.n` of `combine` of each repeat's `width` inputs."""
        def over_repeats(*values):  # Nones left out
            per_repeat = [combine(*values[i:i + width]) for i in range(0, len(values), width)]
            return results_folder.spread([value for value in per_repeat if value is not None]) or {}
        units = {**dict.fromkeys(SPREAD_UNITS, unit), "n": "count"}
        return self.derived_fields(key, over_repeats, inputs, units,
                                   f"results_folder.spread over the repeats of {formula}")

    def over_repeats(self, key, runs, fields, unit, combine=unchanged, formula="the field"):
        """spread_of `combine(*fields)` of each of the repeated `runs` (absent without runs)."""
        fields = (fields,) if isinstance(fields, str) else tuple(fields)
        inputs = [f"{run['path']}#{field}" for run in runs for field in fields]
        return self.spread_of(key, inputs, unit, formula, combine, len(fields))

    def paired_ratio(self, key, runs, others, field, unit="ratio", scale=1.0, formula="ratio",
                     verdict=None):
        """paired_values of `field` of each of `runs` over the run of `others` of the same round."""
        pairs = results_folder.paired(runs, others)
        inputs = [f"{run['path']}#{field}" for pair in pairs for run in pair]
        return self.paired_values(key, inputs, unit, scale, f"{formula}, within each round; "
                                  "spread and interval over rounds", verdict=verdict)

    def paired_values(self, key, inputs, unit, scale, formula, already_ratios=False, verdict=None):
        """spread_of's fields and the verdict's `.low`, `.high` of `scale` x mine / theirs; with
        `verdict`, the verdict is registered under that name too and returned."""
        def over_rounds(*values):
            tops = values if already_ratios else values[0::2]
            bottoms = [1] * len(tops) if already_ratios else values[1::2]
            ratios = [scale * top / bottom for top, bottom in zip(tops, bottoms) if bottom]
            if not ratios:
                return {}
            low, high = results_folder.interval(ratios)
            return dict(results_folder.spread(ratios), low=low, high=high)
        units = {**dict.fromkeys(SPREAD_UNITS, unit), "n": "count", "low": unit, "high": unit}
        fields = self.derived_fields(key, over_rounds, inputs, units, formula)
        return self.verdict(verdict, key) if verdict else fields

    def spread_text(self, key):
        """'7.49 ms (7.05–7.60)': the median and the range, the unit once; '(one run)' alone."""
        self.shown.update([f"{key}.median", f"{key}.n"])
        if self.value(f"{key}.median") is None:
            return NOT_MEASURED
        if self.value(f"{key}.n") == 1:
            return self.text(f"{key}.median") + " (one run)"
        return self.range_text(f"{key}.median", f"{key}.min", f"{key}.max")

    def range_text(self, center, low, high):
        """'233 µs (202–455)': the numbers' texts, the unit once where all three share it."""
        center, low, high = self.text(center), self.text(low), self.text(high)
        unit = re.search(r"[^\d.,]*$", center).group()  # ' ms', '%', '×', ' samples/s'
        if unit and low.endswith(unit) and high.endswith(unit):
            low, high = low.removesuffix(unit), high.removesuffix(unit)
        return f"{center} ({low}–{high})"

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
        """A number's value, or a results file's field for 'file#field'; None if absent."""
        path, _, field = name.partition("#")
        return lookup(load(path), field) if field else self.entries.get(name, {}).get("value")

    def text(self, name):
        """How `name` reads in the document; marks it as shown."""
        self.shown.add(name)
        return self.entries[name]["text"] if name in self.entries else NOT_MEASURED


def data_file(name, file_name, header, rows, caption):
    """{file_name: the rows as CSV, name: a Markdown link to it}."""
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([header, *rows])
    return {file_name: text.getvalue(), name: f"[{caption}]({file_name})"}


def cells(numbers, columns, **fields):
    """A row of `columns`: (header, name template filled from `fields`[, how shown: .text])."""
    return [(show[0] if show else Numbers.text)(numbers, template.format(**fields))
            for _, template, *show in columns]


def headers(columns):
    return [header for header, *_ in columns]  # of cells' columns


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def repo_relative(path):
    """`path` relative to the repository if inside it: any working directory builds the same."""
    relative = os.path.relpath(os.path.abspath(path), REPO)
    return os.path.abspath(path) if relative.startswith("..") else relative
