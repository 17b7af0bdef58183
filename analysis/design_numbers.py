"""The registry of every number the design document quotes: its value, how it is shown, and where it came from."""
import json
import math
import os
import re

from runtime.results import clearly_less, spread

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOT_MEASURED = "not measured"


class BuildError(Exception):
    """A problem with the inputs that the user can fix; reported as one line."""


# --- Results files, and the registry of every number taken from them -------------------------------

loaded = {}  # path -> parsed JSON, read once per build


def load(path):
    if path not in loaded:
        try:
            with open(path) as file:
                loaded[path] = json.load(file)
        except ValueError as error:
            raise BuildError(f"{path} is not valid JSON ({error}); re-run the command that wrote it") from None
    return loaded[path]


def lookup(data, field):
    """`data` at a path such as 'timing.across_ranks.step.median' or 'measurements[3].median_s'; None if absent."""
    for key, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", field):
        try:
            data = data[int(index)] if index else data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def sig(value, digits=3):
    """`value` to `digits` significant figures: fixed-point with thousands separators, or e-notation if tiny."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) < 1e-4:
        return f"{value:.{digits - 1}e}"
    return f"{value:,.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"


def show_bytes(v):
    return f"{v:,.0f} B" if v < 1e3 else sig(v / 1e3) + " kB" if v < 1e6 else sig(v / 1e6) + " MB"


UNITS = {  # unit -> how a value in that unit is shown
    "s": lambda v: sig(v) + " s" if v >= 1 else sig(v * 1e3) + " ms" if v >= 1e-4 else sig(v * 1e6) + " µs",
    "ms": lambda v: sig(v * 1e3) + " ms", "us": lambda v: sig(v * 1e6) + " µs", "trace_us": lambda v: sig(v / 1e3) + " ms",
    "bytes": show_bytes, "bytes-list": lambda v: " + ".join(map(show_bytes, v)), "MiB": lambda v: f"{v:g} MiB",
    "MiB-list": lambda v: ", ".join(f"{x:g}" for x in v) + " MiB", "GB/s": lambda v: sig(v) + " GB/s",
    "Gbit/s": lambda v: f"{v:g} Gbit/s", "ns/byte": lambda v: sig(v * 1e9) + " ns/byte",
    "percent": lambda v: sig(100 * v, 2 if abs(v) < 0.1 else 3) + "%", "round-percent": lambda v: f"{100 * v:g}%",
    "ratio": lambda v: sig(v) + "×", "round-ratio": lambda v: f"{v:g}×", "count": lambda v: f"{v:,}",
    "number": sig, "exact": lambda v: f"{v:g}", "samples/s": lambda v: sig(v) + " samples/s", "name": str,
    "exponent": lambda v: f"2^{round(math.log2(v))}", "ranks": lambda v: f"{v:,} ranks" if v else "beyond 2^20 ranks",
}


class Numbers:
    """Every number the document quotes: value, unit, the text a reader sees, and where it came from."""

    def __init__(self):
        self.entries, self.absent = {}, []

    def add(self, name, value, unit, **provenance):
        if value is None:
            self.absent.append(name)
        else:
            self.entries[name] = {"value": value, "unit": unit, "text": UNITS[unit](value), **provenance}
        return value

    def measured(self, name, path, field, unit):
        """The value of `field` in the results file `path` (absent when the file or the field is)."""
        value = lookup(load(path), field) if path else None
        return self.add(name, value, unit, kind="measured", file=path, field=field)

    def derived(self, name, function, inputs, unit, formula):
        """`function(*values)` of `inputs`, each a registered name or 'file#field'; absent if any input is."""
        return self.derived_fields(name, lambda *values: {"": function(*values)}, inputs, {"": unit}, formula)[""]

    def derived_fields(self, key, function, inputs, units, formula):
        """`key.<field>` for each field of the dict that `function(*values)` returns (just `key` for field "")."""
        values = [lookup(load(i.split("#")[0]), i.split("#")[1]) if "#" in i else self.value(i) for i in inputs]
        result = {} if None in values or not inputs else function(*values)
        return {field: self.add(f"{key}.{field}".rstrip("."), result.get(field), unit, kind="derived",
                                formula=formula, inputs=inputs) for field, unit in units.items()}

    def stated(self, name, value, unit, kind, source):
        """A number from the models, the code, an assumption or a publication."""
        return self.add(name, value, unit, kind=kind, source=source)

    def over_repeats(self, key, runs, fields, unit, combine=lambda value: value, formula="the field"):
        """`key.median`, `.min`, `.max`, `.n`: results.spread over the repeated `runs` of `combine(*fields)`,
        each field a JSON path of one run's file (absent without runs)."""
        fields = (fields,) if isinstance(fields, str) else tuple(fields)
        inputs = [f"{run['path']}#{field}" for run in runs for field in fields]
        width = len(fields)

        def over_runs(*values):
            per_run = [combine(*values[i:i + width]) for i in range(0, len(values), width)]
            return spread([value for value in per_run if value is not None]) or {}
        units = {"median": unit, "min": unit, "max": unit, "n": "count"}
        return self.derived_fields(key, over_runs, inputs, units, f"results.spread over the repeats of {formula}")

    def spread(self, key):
        """{median, min, max, n} of a key registered by `over_repeats`, or None."""
        values = {stat: self.value(f"{key}.{stat}") for stat in ("median", "min", "max", "n")}
        return None if None in values.values() else values

    def spread_text(self, key):
        """'median (min–max)' as a reader sees it; just the median for one run."""
        if self.value(f"{key}.median") is None:
            return NOT_MEASURED
        if self.value(f"{key}.n") == 1:
            return self.text(f"{key}.median") + " (one run)"
        return f"{self.text(key + '.median')} ({self.text(key + '.min')}–{self.text(key + '.max')})"

    def verdict(self, name, a, b):
        """'faster', 'slower' or 'indistinguishable': `a` against `b`, two keys registered by `over_repeats`,
        by results.clearly_less (a gap of medians larger than both spreads)."""
        def compare(*values):
            first, second = dict(zip(("median", "min", "max"), values[:3])), dict(zip(("median", "min", "max"), values[3:]))
            return "faster" if clearly_less(first, second) else "slower" if clearly_less(second, first) \
                else "indistinguishable"
        inputs = [f"{key}.{stat}" for key in (a, b) for stat in ("median", "min", "max")]
        return self.derived(name, compare, inputs, "name",
                            "results.clearly_less of the two spreads: faster only where the gap of medians exceeds both")

    def value(self, name):
        return self.entries.get(name, {}).get("value")

    def text(self, name):
        return self.entries[name]["text"] if name in self.entries else NOT_MEASURED


def table(header, rows):
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def shown(path):
    """`path` as the document records it: relative to the repository when inside it, so that a build from
    any working directory, or with an absolute --results-dir, writes the same document."""
    relative = os.path.relpath(os.path.abspath(path), REPO)
    return os.path.abspath(path) if relative.startswith("..") else relative
