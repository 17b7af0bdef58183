"""What the emulated cluster network measured (§5.6): the all-reduce on shaped links with the α-β
model fitted to it, the highest rate this machine can emulate, and training through SLURM on two
nodes with shaped links beside the model's prediction of the same runs' communication. Inputs
(analysis/make_emulated_results.sh): results/emulated/ and results/slurm/link-<rate>*/; without
them every number reads "not measured".
"""
import functools
import os

from analysis import cost_model, scaling_inputs
from analysis.design_fits import register_fit, spread_over, with_interval
from analysis.design_numbers import NOT_MEASURED, load, table
from analysis.design_performance import register_run_spreads
from analysis.design_scaling import register_readiness
from analysis.scaling_inputs import runs_of
from runtime.options import DEFAULT_BUCKET_MB

RATE = "1gbit"  # the link every training run and the fitted all-reduce used
LINK_BETA = 8 / 1e9  # seconds per byte of the configured rate
LARGE_BYTES = 2**20  # the model's errors are quoted for messages of 1 MiB and more
# (file, label in names, how the text names the layout)
ALLREDUCE_FILES = ((f"allreduce-{RATE}.json", "", "{n} nodes × 1 rank"),
                   (f"allreduce-{RATE}-2pn.json", ".2pn", "2 nodes × 2 ranks"))
IMPLEMENTATIONS = ("gloo", "ring")
SERIES = ("ddp", "manual flat", "manual bucketed")  # §5.6's tables
SHAPES = {2: "2 × 1", 4: "2 × 2"}  # world size -> nodes × ranks per node of the SLURM sweep
FITS_OF_SHAPES = {2: "emulated.fit.gloo.w2", 4: "emulated.fit.gloo.w4.2pn"}
SMALL_BUCKET_MB = 4.0  # the CNN's fc1 gradient (4.7 MB) in a bucket of its own
EXPOSED = "timing.across_ranks.comm_exposed.mean"
NOT_RUN = "*Not measured: run `sudo ./analysis/make_emulated_results.sh`.*"


def emulated_section(numbers, results_dir, layouts):
    """The context of §5.6: every table and number, 'not measured' where a file is missing."""
    folder = os.path.join(results_dir, "emulated")
    numbers.stated("emulated.rate", 1.0, "Gbit/s", "code",
                   "analysis/make_emulated_results.sh: LINK_RATE=1gbit")
    context = fits_tables(numbers, folder)
    context["text.emulated.beta_vs_link"] = with_interval(numbers,
                                                          "emulated.fit.gloo.w2.beta_vs_link")
    ceiling = os.path.join(folder, "link-ceiling.json")
    numbers.measured("emulated.ceiling.rate", ceiling if os.path.exists(ceiling) else None,
                     "highest_link_bound_rate", "name")
    grouped = scaling_inputs.grouped_runs(os.path.join(results_dir, "slurm", f"link-{RATE}"))
    numbers.stated("emulated.default_bucket_mb", DEFAULT_BUCKET_MB, "MiB", "code",
                   "manual_allreduce.DEFAULT_BUCKET_MB, as DDP's bucket_cap_mb")
    ddp_sent = scaling_inputs.ddp_layouts(results_dir)
    for model in ("mlp", "cnn"):
        shares = register_readiness(numbers, results_dir, model)
        rows = training_rows(numbers, grouped, model, layouts[model], ddp_sent.get(model, {}),
                             shares)
        context[f"table.emulated.training.{model}"] = table(
            ["sync", "nodes × ranks", "step", "exposed comm", "predicted exposed",
             "busy ÷ predicted busy"], rows) if rows else NOT_RUN
        # bucketed's exposed communication over flat's, round by round, at 2 nodes × 1
        numbers.paired_ratio(f"emulated.{model}.exposed_ratio",
                             runs_of(grouped, model, "manual bucketed", 2),
                             runs_of(grouped, model, "manual flat", 2), EXPOSED,
                             formula="bucketed's exposed / flat's, in the same round, 2 nodes x 1")
        numbers.verdict(f"emulated.{model}.exposed_verdict", f"emulated.{model}.exposed_ratio")
    ratios = sorted((numbers.value(name), name.removesuffix(".median")) for name in numbers.entries
                    if name.startswith("emulated.") and name.endswith(".busy_vs_predicted.median"))
    for label, end in (("low", 0), ("high", -1)):
        context[f"text.emulated.predict.{label}"] = numbers.spread_text(ratios[end][1]) if ratios \
            else NOT_MEASURED
    smaller_buckets(numbers, os.path.join(results_dir, "slurm", f"link-{RATE}-bucket-4mb"))
    for name in ("mlp.exposed_ratio", "cnn.exposed_ratio", "bucket4.bucketed.exposed_ratio",
                 "bucket4.ddp.exposed_ratio"):  # ratios of one round each, with their spread
        context[f"text.emulated.{name}"] = numbers.spread_text(f"emulated.{name}")
    # flat, which the cap does not change, in each of the two sessions: their drift
    for session, key in (("first", "emulated.cnn.flat.w2"), ("bucket4", "emulated.bucket4.flat")):
        context[f"text.emulated.drift.{session}"] = numbers.spread_text(f"{key}.comm_exposed")
    return context


def large_errors(rows, alpha, beta):
    """The largest relative error of the model over the rows of 1 MiB and more."""
    errors = [abs(cost_model.allreduce_time(row["bytes"], row["world_size"], alpha, beta)
                  - row["median_s"]) / row["median_s"]
              for row in rows if row["bytes"] >= LARGE_BYTES]
    return max(errors) if errors else None


def fits_tables(numbers, folder):
    """Per file, implementation and world size: the α-β fit, β against the link's, and the largest
    error at 1 MiB and more of the fit and of its α with the link's β."""
    rows = {implementation: [] for implementation in IMPLEMENTATIONS}
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
                points = ([row["world_size"] for row in mine], [row["bytes"] for row in mine],
                          [row["median_s"] for row in mine])
                register_fit(numbers, key, points, path, implementation, world)
                for suffix in ("", ".low", ".high"):
                    numbers.derived(f"{key}.beta_vs_link{suffix}", lambda beta: beta / LINK_BETA,
                                    [f"{key}.beta_s_per_byte{suffix}"], "ratio",
                                    "fitted β / (8 bits / configured rate)")
                numbers.derived(f"{key}.large_error", functools.partial(large_errors, mine),
                                [f"{key}.alpha_s", f"{key}.beta_s_per_byte"], "percent",
                                f"largest relative error of the fit, >= 1 MiB, rows of {path}")
                numbers.derived(f"{key}.link_error",
                                lambda alpha, mine=mine: large_errors(mine, alpha, LINK_BETA),
                                [f"{key}.alpha_s"], "percent",
                                f"largest relative error with α fitted and β of the link, "
                                f">= 1 MiB, rows of {path}")
                rows[implementation].append([implementation, layout.format(n=world),
                                             with_interval(numbers, f"{key}.alpha_s"),
                                             with_interval(numbers, f"{key}.beta_vs_link"),
                                             numbers.text(f"{key}.large_error"),
                                             numbers.text(f"{key}.link_error")])
    columns = ["implementation", "layout", "α (95% interval)", "β ÷ the link's 8 ns/byte",
               "largest error ≥ 1 MiB", "… with the link's β"]
    return {f"table.emulated.fits{'' if implementation == 'gloo' else '.' + implementation}":
            table(columns, found) if found else NOT_RUN for implementation, found in rows.items()}


def predicted_exposed(layout, sizes, overlap, world, compute, backward, alpha, beta, *shares):
    """cost_model.project_layout's exposed seconds of one run's layout at its own compute."""
    gradients = cost_model.backward_order(sizes, shares)
    return cost_model.project_layout(compute, backward, layout, gradients, world, alpha, beta,
                                     overlap)["exposed_s"]


def training_rows(numbers, grouped, model, sizes, ddp_sent, shares):
    """Per series and shape: the SLURM runs' spreads, the model's exposed time at the runs' own
    compute, and measured busy over the model's."""
    rows = []
    for world, shape in SHAPES.items():
        for series in SERIES:
            runs = runs_of(grouped, model, series, world)
            prefix = f"emulated.{model}.{series.replace('manual ', '')}.w{world}"
            register_run_spreads(numbers, prefix, runs)
            if not runs:
                continue
            layout = scaling_inputs.run_layout(runs[0], sizes, ddp_sent)
            fit = FITS_OF_SHAPES[world]
            coefficients = [f"{fit}.alpha_s", f"{fit}.beta_s_per_byte"]
            if layout:
                numbers.derived(f"{prefix}.predicted_busy",
                                functools.partial(cost_model.step_comm_time, layout, world),
                                coefficients, "ms",
                                "cost_model.step_comm_time of the run's all-reduces")
                # bucketed's and DDP's all-reduces start during backward
                exposed = functools.partial(predicted_exposed, layout, sizes,
                                            series in ("manual bucketed", "ddp"), world)
                numbers.derived(f"{prefix}.predicted_exposed", exposed,
                                [f"{prefix}.compute.median", f"{prefix}.backward.median"]
                                + coefficients + shares, "ms",
                                "cost_model.project_layout at the runs' median compute and "
                                "backward, gradients ready as traced")
                spread_over(numbers, f"{prefix}.busy_vs_predicted", f"{prefix}.comm_busy",
                            f"{prefix}.predicted_busy", "measured busy / predicted busy")
            rows.append([series, shape, numbers.text(f"{prefix}.step.median"),
                         numbers.spread_text(f"{prefix}.comm_exposed"),
                         numbers.text(f"{prefix}.predicted_exposed"),
                         numbers.spread_text(f"{prefix}.busy_vs_predicted")])
    return rows


def smaller_buckets(numbers, folder):
    """The CNN at 2 nodes x 1 with 4 MiB buckets: bucketed's and DDP's exposed time over flat's."""
    grouped = scaling_inputs.grouped_runs(folder)
    found = {series: grouped.get(("cnn", series, 2, SMALL_BUCKET_MB), [])
             for series in ("manual flat", "manual bucketed", "ddp")}
    # flat's exposed time: the same work as the first session's flat, so their drift
    register_run_spreads(numbers, "emulated.bucket4.flat", found["manual flat"], ("comm_exposed",))
    for series in ("manual bucketed", "ddp"):
        name = f"emulated.bucket4.{series.replace('manual ', '')}"
        numbers.paired_ratio(f"{name}.exposed_ratio", found[series], found["manual flat"],
                             EXPOSED, formula=f"{series}'s exposed / flat's, in the same round")
        numbers.verdict(f"{name}.exposed_verdict", f"{name}.exposed_ratio")
