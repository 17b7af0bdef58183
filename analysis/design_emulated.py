"""What the emulated cluster network measured (§5.6): the all-reduce on shaped links with the α-β
model fitted to it, the highest rate this machine can emulate, and training through SLURM on two
nodes beside the model's prediction; from results/emulated/ and results/slurm/link-<rate>*/."""
import functools
import itertools
import os

from analysis import cost_model, design_scaling, scaling_inputs
from analysis.design_fits import predicted_busy, register_fit, spread_over, with_interval
from analysis.design_numbers import NOT_MEASURED, load, table
from analysis.design_performance import STEP, register_run_spreads, slug
from runtime.options import DEFAULT_BUCKET_MB

RATE = "1gbit"  # the link every training run and the fitted all-reduce used
LINK_BETA = 8 / 1e9  # seconds per byte of the configured rate (no task code runs at import)
# (file, label in names, how the text names the layout, the world sizes make_emulated_results.sh
# measures: their fits read "not measured" without the file)
ALLREDUCE_FILES = ((f"allreduce-{RATE}.json", "", "{n} nodes × 1 rank", (2, 4)),
                   (f"allreduce-{RATE}-2pn.json", ".2pn", "2 nodes × 2 ranks", (4,)))
# world size -> (nodes × ranks per node of the SLURM sweep, the fit of that layout)
SHAPES = {2: ("2 × 1", "emulated.fit.gloo.w2"), 4: ("2 × 2", "emulated.fit.gloo.w4.2pn")}
SMALL_BUCKET_MB = 4.0  # the CNN's fc1 gradient (4.7 MB) in a bucket of its own
EXPOSED = "timing.across_ranks.comm_exposed.mean"
NOT_RUN = "*Not measured: run `sudo ./analysis/make_emulated_results.sh`.*"


def emulated_section(numbers, results_dir, layouts):
    """The context of §5.6: every table and number, 'not measured' where a file is missing."""
    folder, slurm = os.path.join(results_dir, "emulated"), os.path.join(results_dir, "slurm")
    numbers.stated("emulated.rate", 1.0, "Gbit/s", "code",
                   "analysis/make_emulated_results.sh: LINK_RATE=1gbit")
    context = fits_tables(numbers, folder)
    context["text.emulated.beta_vs_link"] = with_interval(numbers,
                                                          "emulated.fit.gloo.w2.beta_vs_link")
    ceiling = os.path.join(folder, "link-ceiling.json")
    numbers.measured("emulated.ceiling.rate", ceiling if os.path.exists(ceiling) else None,
                     "highest_link_bound_rate", "name")
    grouped = scaling_inputs.grouped_runs(os.path.join(slurm, f"link-{RATE}"))
    numbers.stated("emulated.default_bucket_mb", DEFAULT_BUCKET_MB, "MiB", "code",
                   "manual_allreduce.DEFAULT_BUCKET_MB, as DDP's bucket_cap_mb")
    for model in ("mlp", "cnn"):
        context[f"table.emulated.training.{model}"] = training_table(numbers, results_dir,
                                                                     grouped, model, layouts)
        numbers.paired_ratio(f"emulated.{model}.exposed_ratio",
                             scaling_inputs.runs_of(grouped, model, "manual bucketed", 2),
                             scaling_inputs.runs_of(grouped, model, "manual flat", 2), EXPOSED,
                             formula="bucketed's exposed / flat's, in the same round, 2 nodes x 1",
                             verdict=f"emulated.{model}.exposed_verdict")
    ratios = sorted((numbers.value(name), name.removesuffix(".median")) for name in numbers.entries
                    if name.startswith("emulated.") and name.endswith(".busy_vs_predicted.median"))
    for label, end in (("low", 0), ("high", -1)):
        context[f"text.emulated.predict.{label}"] = numbers.spread_text(ratios[end][1]) if ratios \
            else NOT_MEASURED
    # the CNN at 2 nodes × 1 with 4 MiB buckets: bucketed's and DDP's exposed time over flat's
    grouped = scaling_inputs.grouped_runs(os.path.join(slurm, f"link-{RATE}-bucket-4mb"))
    flat = scaling_inputs.runs_of(grouped, "cnn", "manual flat", 2, SMALL_BUCKET_MB)
    # flat's exposed time: the same work as the first session's flat, so their drift
    register_run_spreads(numbers, "emulated.bucket4.flat", flat, ("comm_exposed",))
    for session, key in (("first", "emulated.cnn.flat.w2"), ("bucket4", "emulated.bucket4.flat")):
        context[f"text.emulated.drift.{session}"] = numbers.spread_text(f"{key}.comm_exposed")
    for series in ("manual bucketed", "ddp"):
        name = f"emulated.bucket4.{slug(series)}"
        runs = scaling_inputs.runs_of(grouped, "cnn", series, 2, SMALL_BUCKET_MB)
        for field, source in (("exposed", EXPOSED), ("step", STEP)):
            numbers.paired_ratio(f"{name}.{field}_ratio", runs, flat, source,
                                 formula=f"{series}'s {field} / flat's, in the same round",
                                 verdict=f"{name}.{field}_verdict")
    for name in ("mlp.exposed_ratio", "cnn.exposed_ratio", "bucket4.bucketed.exposed_ratio",
                 "bucket4.ddp.exposed_ratio", "bucket4.bucketed.step_ratio"):  # paired by round
        context[f"text.emulated.{name}"] = numbers.spread_text(f"emulated.{name}")
    return context


def large_errors(rows, alpha, beta):
    """The largest relative error of the model over the rows of 1 MiB and more."""
    return max((abs(cost_model.allreduce_time(row["bytes"], row["world_size"], alpha, beta)
                    - row["median_s"]) / row["median_s"]
                for row in rows if row["bytes"] >= 2**20), default=None)


def fits_tables(numbers, folder):
    """Per file, implementation and world size: the fit, β ÷ the link's and the error ≥ 1 MiB."""
    rows = []
    for (name, label, layout, expected), implementation in itertools.product(ALLREDUCE_FILES,
                                                                             ("gloo", "ring")):
        path = os.path.join(folder, name)
        measured = ([row for row in load(path)["measurements"] if row.get("verified", True)]
                    if os.path.exists(path) else [])
        for world in sorted({row["world_size"] for row in measured} | set(expected)):
            key = f"emulated.fit.{implementation}.w{world}{label}"
            mine = register_fit(numbers, key, measured, path, implementation, world)
            if not mine:
                continue
            for suffix in ("", ".low", ".high"):
                numbers.derived(f"{key}.beta_vs_link{suffix}", lambda beta: beta / LINK_BETA,
                                [f"{key}.beta_s_per_byte{suffix}"], "ratio",
                                "fitted β / (8 bits / configured rate)")
            numbers.derived(f"{key}.large_error", functools.partial(large_errors, mine),
                            [f"{key}.alpha_s", f"{key}.beta_s_per_byte"], "percent",
                            f"largest relative error of the fit, >= 1 MiB, rows of {path}")
            rows.append([implementation, layout.format(n=world),
                         with_interval(numbers, f"{key}.alpha_s"),
                         with_interval(numbers, f"{key}.beta_vs_link"),
                         numbers.text(f"{key}.large_error")])
    return {"table.emulated.fits": table(["implementation", "layout", "α (95% interval)",
                                          "β ÷ the link's 8 ns/byte", "largest error ≥ 1 MiB"],
                                         sorted(rows)) if rows else NOT_RUN}


def predicted_exposed(layout, sizes, overlap, world, compute, backward, alpha, beta, *shares):
    """cost_model.project_layout's exposed seconds of one run's layout at its own compute."""
    gradients = cost_model.backward_order(sizes, shares)
    return cost_model.project_layout(compute, backward, layout, gradients, world, alpha, beta,
                                     overlap)["exposed_s"]


def training_table(numbers, results_dir, grouped, model, layouts):
    """Per series and shape: the SLURM runs' spreads, the model's exposed and busy time for them."""
    shares = design_scaling.register_readiness(numbers, results_dir, model)
    ddp_sent = scaling_inputs.ddp_layouts(results_dir).get(model, {})
    rows = []
    for world, (shape, fit) in SHAPES.items():
        for series in ("ddp", "manual flat", "manual bucketed"):
            runs = scaling_inputs.runs_of(grouped, model, series, world)
            prefix = f"emulated.{model}.{slug(series)}.w{world}"
            register_run_spreads(numbers, prefix, runs)
            layout = runs and scaling_inputs.run_layout(runs[0], layouts[model], ddp_sent)
            if layout:
                alpha_beta = predicted_busy(numbers, f"{prefix}.predicted_busy", layout, world, fit,
                                            "cost_model.step_comm_time of the run's all-reduces")
                # bucketed's and DDP's all-reduces start during backward
                exposed = functools.partial(predicted_exposed, layout, layouts[model],
                                            series in ("manual bucketed", "ddp"), world)
                numbers.derived(f"{prefix}.predicted_exposed", exposed, [
                    f"{prefix}.compute.median", f"{prefix}.backward.median", *alpha_beta, *shares],
                    "ms", "cost_model.project_layout at the runs' median compute and backward, "
                    "gradients ready as traced")
                spread_over(numbers, f"{prefix}.busy_vs_predicted", f"{prefix}.comm_busy",
                            f"{prefix}.predicted_busy", "measured busy / predicted busy")
            if runs:
                rows.append([series, shape, numbers.text(f"{prefix}.step.median"),
                             numbers.spread_text(f"{prefix}.comm_exposed"),
                             numbers.text(f"{prefix}.predicted_exposed"),
                             numbers.spread_text(f"{prefix}.busy_vs_predicted")])
    return table(["sync", "nodes × ranks", "step", "exposed comm", "predicted exposed",
                  "busy ÷ predicted busy"], rows) if rows else NOT_RUN
