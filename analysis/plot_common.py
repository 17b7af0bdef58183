"""What every figure shares: one colour per series, the series' teaching order, labels, the unit
of step times, and a spread over repeats drawn as a median with bars from fastest to slowest."""
import matplotlib
import numpy as np

from runtime.options import DEFAULT_BUCKET_MB

matplotlib.use("Agg")  # files only, no display needed; set before any figure is made

MS = 1e3  # seconds to milliseconds: every step-time axis is in ms
SERIES_COLOURS = {"single": "black", "ddp-no-sync": "tab:gray", "ddp": "tab:blue",
                  "manual per-param": "tab:orange", "manual flat": "tab:green",
                  "manual bucketed": "tab:red", "manual flat-ring": "tab:purple",
                  "manual flat-shm": "tab:cyan"}  # in the teaching order
VARIANT_COLOURS = ("tab:brown", "tab:olive", "tab:pink")


def plural(count, noun):
    """'1 run', '3 runs', '4 processes': the count with its noun, in the plural where needed."""
    ending = "es" if noun.endswith("s") else "s"
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{ending}"


def colour(series):
    """One colour per series in every figure; variants (fp16, ...) take one of three others."""
    if series in SERIES_COLOURS:
        return SERIES_COLOURS[series]
    return VARIANT_COLOURS[sum(map(ord, series)) % len(VARIANT_COLOURS)]


def series_rank(series):
    """Sort key of a series: the teaching order, then any variant by name."""
    known = list(SERIES_COLOURS)
    return (known.index(series) if series in known else len(known)), series


def order(item):
    """Sort key of a (configuration, runs) pair: model, world size, then the teaching order."""
    (model, series, world, bucket_mb), _runs = item
    return model, world, series_rank(series), bucket_mb


def uses_buckets(series):
    """Whether --bucket-mb changes what the series sends: DDP's and bucketed's buckets."""
    return series == "ddp" or series.startswith("manual bucketed")


def bucket_variant(configuration):
    """A bucketing series at a bucket size other than the default: bucket-sweep.png only."""
    _model, series, _world, bucket_mb = configuration
    return uses_buckets(series) and bucket_mb != DEFAULT_BUCKET_MB


def medians(spreads, scale=1.0):
    """The spreads' medians times `scale` (a number, or one per spread)."""
    return scale * np.array([spread["median"] for spread in spreads])


def errors(spreads, scale=1.0):
    """matplotlib's asymmetric error bars: from each spread's median to its min and max."""
    below = [spread["median"] - spread["min"] for spread in spreads]
    above = [spread["max"] - spread["median"] for spread in spreads]
    return scale * np.array([below, above])
