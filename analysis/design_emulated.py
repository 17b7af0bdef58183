"""What the emulated cluster network measured (§5.7): the all-reduce on shaped links with the α-β
model fitted to it and checked against the configured rate, the highest rate this machine can
emulate, and training through SLURM on two nodes whose links are shaped, beside the model's
prediction.

Inputs (analysis/make_emulated_results.sh writes them): results/emulated/allreduce-<rate>.json
(one rank per node) and allreduce-<rate>-2pn.json (two ranks per node), link-ceiling.json, and the
training runs in results/slurm/link-<rate>/. Without them every number reads "not measured".
"""
import functools
import os

from analysis import cost_model, results_folder
from analysis.design_fits import predicted_busy, predicted_time, register_fit
from analysis.design_numbers import largest, load, ratio, smallest, table, unchanged
from analysis.design_performance import register_run_spreads
from runtime.options import DEFAULT_BUCKET_MB

RATE = "1gbit"  # the link every training run and the fitted all-reduce used
LINK_BITS_PER_S = 1e9
LARGE_BYTES = 2**20  # the target: the model within TARGET_ERROR for messages of 1 MiB and more
TARGET_ERROR = 0.25
# (file, label in names, how the text names the layout)
ALLREDUCE_FILES = ((f"allreduce-{RATE}.json", "", "{n} nodes × 1 rank"),
                   (f"allreduce-{RATE}-2pn.json", ".2pn", "2 nodes × 2 ranks"))
IMPLEMENTATIONS = ("gloo", "ring")
RING_VARIANT = f"ring-receive-first-{RATE}.json"  # benchmarks/ring_variants/receive_first.py
RING_NAMES = {"ring": "lesson", "candidate": "receive_first"}
RING_QUOTED = ("lesson.w2.16m", "receive_first.w2.16m", "lesson.w4.1m", "receive_first.w4.1m")
SERIES = ("ddp", "manual per-param", "manual flat", "manual bucketed")
SHAPES = {2: "2 × 1", 4: "2 × 2"}  # world size -> nodes × ranks per node of the SLURM sweep
SMALL_BUCKET_MB = 4.0  # the CNN's fc1 gradient (4.7 MB) in a bucket of its own
FIT_COLUMNS = ["implementation", "layout", "α", "β", "β ÷ the link's (8 bits ÷ rate)",
               "largest error ≥ 1 MiB: fit", "largest error ≥ 1 MiB: α fitted, β of the link"]
CEILING_COLUMNS = ["configured rate", "gloo busbw", "gloo ÷ rate", "ring busbw", "ring ÷ rate"]
TRAINING_COLUMNS = ["sync", "nodes × ranks", "runs", "step", "busy comm", "hidden", "exposed",
                    "overlap", "predicted busy", "measured ÷ predicted busy"]


def emulated_section(numbers, results_dir, layouts):
    """The context of §5.7: every table and number, 'not measured' where a file is missing."""
    folder = os.path.join(results_dir, "emulated")
    numbers.stated("emulated.rate", LINK_BITS_PER_S / 1e9, "Gbit/s", "code",
                   "analysis/make_emulated_results.sh: LINK_RATE=1gbit")
    numbers.stated("emulated.link_beta", 8 / LINK_BITS_PER_S, "ns/byte", "code",
                   "8 bits per byte / the configured rate")
    numbers.stated("emulated.large_mib", LARGE_BYTES / 2**20, "MiB", "code",
                   "the target: messages of 1 MiB and more")
    numbers.stated("emulated.target_error", TARGET_ERROR, "round-percent", "code",
                   "analysis/design_emulated.TARGET_ERROR")
    ring_order_numbers(numbers, folder)
    context = {"table.emulated.fits": fits_table(numbers, folder),
               "table.emulated.ceiling": ceiling_table(numbers, folder)}
    training = os.path.join(results_dir, "slurm", f"link-{RATE}")
    grouped = repeats_in(training)
    numbers.stated("emulated.default_bucket_mb", DEFAULT_BUCKET_MB, "MiB", "code",
                   "manual_allreduce.DEFAULT_BUCKET_MB, as DDP's bucket_cap_mb")
    numbers.stated("emulated.cnn.buckets", cost_model.bucket_sizes(layouts["cnn"],
                                                                   DEFAULT_BUCKET_MB),
                   "bytes-list", "code", "cost_model.bucket_sizes of the CNN at the default cap")
    numbers.stated("emulated.cnn.fc1_bytes", max(layouts["cnn"]), "bytes", "model",
                   "runtime/models.py: the CNN's largest gradient, fc1's weight")
    for model in ("mlp", "cnn"):
        context[f"table.emulated.training.{model}"] = training_table(
            numbers, grouped, model, layouts[model])
        overlap_numbers(numbers, model)
    ratios = [name for name in numbers.entries if name.startswith("emulated.")
              and name.endswith(".busy_vs_predicted")]
    for label, pick in (("low", smallest), ("high", largest)):
        numbers.derived(f"emulated.predict.{label}", pick, ratios, "ratio",
                        f"the {label}est measured / predicted busy of §5.7")
    smaller_buckets(numbers, training + f"-bucket-{SMALL_BUCKET_MB:g}mb")
    return context


def print_nothing(note):
    """results_folder.load_folder's notes of files skipped: plots and other schemas, expected
    here."""


def repeats_in(folder):
    """results_folder.repeats of the training runs in `folder`; none if it does not exist."""
    if not os.path.isdir(folder):
        return {}
    runs, _ = results_folder.load_folder(folder, note=print_nothing)
    return results_folder.repeats(runs)


def runs_of(grouped, model, series, world):
    """The repeated runs of one configuration in `grouped` (results_folder.repeats), whatever their
    bucket size; [] if there are none."""
    return next((runs for (run_model, run_series, run_world, _), runs in grouped.items()
                 if (run_model, run_series, run_world) == (model, series, world)), [])


def large_errors(rows, alpha, beta):
    """The largest |predicted − measured| / measured over the rows of 1 MiB and more."""
    errors = [abs(predicted_time(row["bytes"], row["world_size"], alpha, beta) - row["median_s"])
              / row["median_s"] for row in rows if row["bytes"] >= LARGE_BYTES]
    return max(errors) if errors else None


def fits_table(numbers, folder):
    """Per file, implementation and world size: the α-β fit, β against the link's, and the
    largest error at 1 MiB and more of the fit and of the model with the link's β."""
    rows = []
    worst = {implementation: [] for implementation in IMPLEMENTATIONS}
    for name, label, layout in ALLREDUCE_FILES:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            continue
        measured = [row for row in load(path)["measurements"] if row.get("verified", True)]
        for implementation in IMPLEMENTATIONS:
            for world in sorted({row["world_size"] for row in measured}):
                mine = [row for row in measured if row["implementation"] == implementation
                        and row["world_size"] == world]
                if len(mine) < 2:
                    continue
                key = f"emulated.fit.{implementation}.w{world}{label}"
                fit = cost_model.fit_alpha_beta([row["world_size"] for row in mine],
                                                [row["bytes"] for row in mine],
                                                [row["median_s"] for row in mine])
                register_fit(numbers, key, fit, path, implementation, world)
                numbers.add(f"{key}.beta_vs_link", fit.beta / (8 / LINK_BITS_PER_S), "ratio",
                            kind="derived", formula="fitted β / (8 bits / configured rate)",
                            inputs=[f"{key}.beta_s_per_byte", "emulated.link_beta"])
                fit_error = large_errors(mine, fit.alpha, fit.beta)
                link_error = large_errors(mine, fit.alpha, 8 / LINK_BITS_PER_S)
                rows_field = [f"{path}#measurements"]
                numbers.add(f"{key}.large_error", fit_error, "percent", kind="derived",
                            inputs=rows_field, formula="largest relative error of the fit, "
                                                       ">= 1 MiB")
                numbers.add(f"{key}.link_error", link_error, "percent", kind="derived",
                            inputs=rows_field, formula="largest relative error with α fitted "
                                                       "and β of the link, >= 1 MiB")
                worst[implementation].append((fit_error, f"{key}.large_error"))
                rows.append([implementation, layout.format(n=world)]
                            + [numbers.text(f"{key}.{field}") for field in (
                                "alpha_s", "beta_s_per_byte", "beta_vs_link", "large_error",
                                "link_error")])
    for implementation, errors in worst.items():
        numbers.add(f"emulated.fit.{implementation}.worst_large_error",
                    max(error for error, _ in errors) if errors else None, "percent",
                    kind="derived", inputs=[name for _, name in errors],
                    formula=f"the largest error at >= 1 MiB of every {implementation} fit")
    return table(FIT_COLUMNS, rows) if rows else "*Not measured: run " \
        "`sudo ./analysis/make_emulated_results.sh`.*"


def ring_order_numbers(numbers, folder):
    """The lesson's ring and the variant that posts each receive before its send, each as its
    bus bandwidth over gloo's: 'emulated.ring_order.<lesson|receive_first>.w<n>.<size>'."""
    path = os.path.join(folder, RING_VARIANT)
    comparisons = load(path)["comparisons"] if os.path.exists(path) else []
    for index, row in enumerate(comparisons):
        name = RING_NAMES.get(row["implementation"])
        if name:
            size = f"{row['bytes'] // 2**10}k" if row["bytes"] < 2**20 \
                else f"{row['bytes'] // 2**20}m"
            numbers.measured(f"emulated.ring_order.{name}.w{row['world_size']}.{size}", path,
                             f"comparisons[{index}].busbw_ratio_to_gloo", "ratio")
    for name in RING_QUOTED:  # what §5.7 quotes, "not measured" without the file
        if f"emulated.ring_order.{name}" not in numbers.entries:
            numbers.add(f"emulated.ring_order.{name}", None, "ratio")


def ceiling_table(numbers, folder):
    """Achieved bus bandwidth ÷ configured rate per rate, and the highest link-bound rate."""
    path = os.path.join(folder, "link-ceiling.json")
    numbers.measured("emulated.ceiling.rate", path if os.path.exists(path) else None,
                     "highest_link_bound_rate", "name")
    numbers.measured("emulated.ceiling.size", path if os.path.exists(path) else None,
                     "rows[0].bytes", "bytes")
    numbers.measured("emulated.ceiling.bound", path if os.path.exists(path) else None,
                     "config.bound", "round-percent")
    if not os.path.exists(path):
        return "*Not measured: run `sudo python -m benchmarks.link_ceiling`.*"
    by_rate = {}
    for row in load(path)["rows"]:
        by_rate.setdefault(row["rate"], {})[row["implementation"]] = row
    rows = []
    for rate, measured in by_rate.items():
        cells = [rate]
        for implementation in IMPLEMENTATIONS:
            row = measured.get(implementation)
            if row is None:
                cells += ["—", "—"]
                continue
            achieved = row["achieved_fraction"]
            cells += [f"{row['busbw_gbps'] * 8:.2f} Gbit/s",
                      "—" if achieved is None else f"{100 * achieved:.0f}%"]
        rows.append(cells)
    return table(CEILING_COLUMNS, rows)


def fit_for(numbers, world):
    """(alpha, beta) of gloo's emulated fit for the SLURM shape at `world` ranks, or None."""
    key = "emulated.fit.gloo.w2" if world == 2 else "emulated.fit.gloo.w4.2pn"
    alpha, beta = numbers.value(f"{key}.alpha_s"), numbers.value(f"{key}.beta_s_per_byte")
    return None if alpha is None or beta is None else (alpha, beta, key)


def training_table(numbers, grouped, model, layout):
    """Per series and shape: the spreads of the SLURM runs and the model's busy time."""
    rows = []
    for world, shape in SHAPES.items():
        for series in SERIES:
            runs = runs_of(grouped, model, series, world)
            prefix = f"emulated.{model}.{series.replace('manual ', '')}.w{world}"
            register_run_spreads(numbers, prefix, runs)
            bucket_mb = float(runs[0]["config"]["bucket_mb"]) if runs else None
            strategy = "ddp" if series == "ddp" else series.replace("manual ", "")
            fit = fit_for(numbers, world)
            if fit and runs:
                messages = cost_model.messages_per_step(strategy, layout, bucket_mb)
                numbers.derived(f"{prefix}.predicted_busy",
                                functools.partial(predicted_busy, messages, world),
                                [f"{fit[2]}.alpha_s", f"{fit[2]}.beta_s_per_byte"], "ms",
                                f"cost_model.step_comm_time of {strategy}'s all-reduces")
                numbers.derived(f"{prefix}.busy_vs_predicted", ratio,
                                [f"{prefix}.comm_busy.median", f"{prefix}.predicted_busy"],
                                "ratio", "measured median busy / predicted busy")
            if not runs:
                continue
            rows.append([series, shape, len(runs)]
                        + [numbers.spread_text(f"{prefix}.{field}") for field in
                           ("step", "comm_busy", "comm_hidden", "comm_exposed", "overlap")]
                        + [numbers.text(f"{prefix}.predicted_busy"),
                           numbers.text(f"{prefix}.busy_vs_predicted")])
    return table(TRAINING_COLUMNS, rows) if rows else "*Not measured: run " \
        "`sudo ./analysis/make_emulated_results.sh`.*"


def overlap_numbers(numbers, model):
    """Bucketed's exposed communication against flat's, at 2 nodes × 1, with its verdict."""
    bucketed, flat = (f"emulated.{model}.{name}.w2" for name in ("bucketed", "flat"))
    numbers.derived(f"emulated.{model}.exposed_ratio", ratio,
                    [f"{bucketed}.comm_exposed.median", f"{flat}.comm_exposed.median"], "ratio",
                    "bucketed's median exposed communication / flat's, 2 nodes x 1 rank")
    numbers.verdict(f"emulated.{model}.exposed_verdict", f"{bucketed}.comm_exposed",
                    f"{flat}.comm_exposed")
    numbers.derived(f"emulated.{model}.hidden_share", unchanged,
                    [f"{bucketed}.overlap.median"], "percent",
                    "bucketed's median hidden / busy, 2 nodes x 1 rank")



def smaller_buckets(numbers, folder):
    """The CNN at 2 nodes x 1 with 4 MiB buckets (flat, bucketed and ddp run side by side):
    'emulated.bucket4.<series>.*', and bucketed's and DDP's exposed time over flat's."""
    grouped = repeats_in(folder)
    for series in ("manual flat", "manual bucketed", "ddp"):
        found = grouped.get(("cnn", series, 2, SMALL_BUCKET_MB), [])
        register_run_spreads(numbers, f"emulated.bucket4.{series.replace('manual ', '')}", found)
    for series in ("bucketed", "ddp"):
        name = f"emulated.bucket4.{series}"
        numbers.derived(f"{name}.exposed_ratio", ratio,
                        [f"{name}.comm_exposed.median",
                         "emulated.bucket4.flat.comm_exposed.median"],
                        "ratio", f"{series}'s median exposed communication / flat's, 4 MiB buckets")
        numbers.verdict(f"{name}.exposed_verdict", f"{name}.comm_exposed",
                        "emulated.bucket4.flat.comm_exposed")
