"""projection.png: the α-β model's projected efficiency against ranks (2 to 1024) per link and
model, with the training runs that measured efficiency drawn on it.

Lines: the best of one flat all-reduce and every bucket size (cost_model.best_bucket), ring
solid and halving-doubling dashed, from this machine's single-process compute and backward and
each gradient's traced readiness; the two fitted links carry a band over their bootstrap
resamples. Points: each run's compute / (compute + exposed communication) (filled, bars from
min to max) and the model's at that run's own compute, layout and fit (hollow), for the
emulated network's runs and this machine's sweep at 2 ranks (a core per rank).
"""
import os

import matplotlib.pyplot as plt
import numpy as np

from analysis import cost_model, results_folder, scaling_inputs
from analysis.plot_common import errors, medians
from runtime.options import DEFAULT_BUCKET_MB

MODELS = ("mlp", "cnn")
BAND_DRAWS = 200  # bootstrap resamples behind each band: enough for a 95 % band to settle
LINK_COLOURS = {"loopback": "tab:gray", "1g": "tab:purple", "10g": "tab:blue",
                "25g": "tab:green", "100g": "tab:red"}
SERIES_MARKERS = {"manual flat": "o", "manual bucketed": "s", "ddp": "^"}
SERIES_SHIFT = {"manual flat": 0.87, "manual bucketed": 1.0, "ddp": 1.15}  # apart on a log axis
EMULATED = os.path.join("slurm", "link-1gbit")
# the fitted links: name -> (all-reduce benchmark, the label drawn)
FITTED = {"loopback": ("allreduce-bench.json", "this machine's loopback (fit, 2 ranks)"),
          "1g": (os.path.join("emulated", "allreduce-1gbit.json"),
                 "1 Gbit/s emulated (fit, 2 nodes)")}
EMULATED_FITS = {2: ("allreduce-1gbit.json", 2), 4: ("allreduce-1gbit-2pn.json", 4)}


def links(results_dir):
    """{link: {label, alpha, beta, draws}}: the fitted links found, then the assumed ones."""
    found = {}
    for link, (name, label) in FITTED.items():
        fit = scaling_inputs.gloo_fit(os.path.join(results_dir, name), 2, BAND_DRAWS)
        if fit:
            found[link] = {"label": label, "alpha": fit[0], "beta": fit[1], "draws": fit[2]}
    for gbit in cost_model.CLUSTER_LINKS_GBIT:
        found[f"{gbit}g"] = {"label": f"{gbit} Gbit/s, α {cost_model.CLUSTER_ALPHA_S * 1e6:g} µs",
                             "alpha": cost_model.CLUSTER_ALPHA_S,
                             "beta": cost_model.link_beta(gbit), "draws": None}
    return found


def efficiency(model, world, alpha, beta, algorithm="ring"):
    """The best projected efficiency of `model` (projection_inputs' entry) at `world` ranks."""
    _, projection = cost_model.best_bucket(model["compute"], model["backward"], model["sizes"],
                                           model["shares"], world, alpha, beta,
                                           algorithm=algorithm)
    return projection["efficiency"]


def measured_points(folder, model, sizes, shares, fits, ddp_sent):
    """[{series, world, measured, modelled}] of the runs in `folder` at the world sizes of `fits`
    ({world: (alpha, beta)}), each modelled at its own compute and layout."""
    points = []
    gradients = cost_model.backward_order(sizes, shares)
    for (run_model, series, world, _), runs in scaling_inputs.grouped_runs(folder).items():
        if run_model != model or series not in SERIES_MARKERS or world not in fits:
            continue
        layout = scaling_inputs.run_layout(runs[0], sizes, ddp_sent)
        spreads = results_folder.across_repeats(runs)
        measured = results_folder.spread([
            step["compute"] / (step["compute"] + step["comm_exposed"])
            for step in map(results_folder.per_step, runs)])
        modelled = layout and cost_model.project_layout(
            spreads["compute"]["median"], spreads["backward"]["median"], layout, gradients, world,
            *fits[world], series != "manual flat")["efficiency"]
        points.append({"series": series, "world": world, "measured": measured,
                       "modelled": modelled or None})
    return points


def projection_inputs(results_dir):
    """{"links": links(), "models": {model: {sizes, shares, compute, backward, points}}}; a
    model without its single process or its backward trace is left out."""
    runs, _ = results_folder.load_folder(results_dir, note=lambda note: None)
    grouped = results_folder.repeats(runs)
    models = {}
    for model in MODELS:
        single = scaling_inputs.runs_of(grouped, model, "single", 1, DEFAULT_BUCKET_MB)
        readiness = scaling_inputs.readiness(results_dir, model)
        if single and readiness is not None:
            spreads = results_folder.across_repeats(single)
            models[model] = {"sizes": [nbytes for _, nbytes in scaling_inputs.parameters(model)],
                             "shares": list(readiness.values()),
                             "compute": spreads["compute"]["median"],
                             "backward": spreads["backward"]["median"]}
    if not models:
        return {"links": {}, "models": {}}
    found = links(results_dir)
    sent = scaling_inputs.ddp_layouts(results_dir)
    emulated = {world: scaling_inputs.gloo_fit(os.path.join(results_dir, "emulated", name),
                                               fit_world) for world, (name, fit_world)
                in EMULATED_FITS.items()}
    for model, inputs in models.items():
        arguments = (inputs["sizes"], inputs["shares"])
        inputs["points"] = {}
        if "loopback" in found:  # the only world size where each rank has a core of its own
            inputs["points"]["loopback"] = measured_points(
                results_dir, model, *arguments,
                {2: (found["loopback"]["alpha"], found["loopback"]["beta"])}, sent.get(model, {}))
        inputs["points"]["1g"] = measured_points(
            os.path.join(results_dir, EMULATED), model, *arguments,
            {world: fit[:2] for world, fit in emulated.items() if fit}, sent.get(model, {}))
    return {"links": found, "models": models}


def draw_link(axis, model, link, fitted):
    """One link's projected efficiency with the ring and halving-doubling, and its band."""
    worlds = np.array(cost_model.FIGURE_WORLD_SIZES)
    style = {"color": LINK_COLOURS[link]}
    for algorithm, line in (("ring", "-"), ("halving-doubling", "--")):
        values = [efficiency(model, world, fitted["alpha"], fitted["beta"], algorithm)
                  for world in worlds]
        axis.plot(worlds, 100 * np.array(values), linestyle=line, linewidth=1.4 if
                  algorithm == "ring" else 0.9, label=fitted["label"] if algorithm == "ring"
                  else None, gid=f"{link} {algorithm}", **style)
    if fitted["draws"]:
        bands = [cost_model.interval([efficiency(model, world, alpha, beta)
                                      for alpha, beta in fitted["draws"]]) for world in worlds]
        low, high = zip(*bands)
        axis.fill_between(worlds, 100 * np.array(low), 100 * np.array(high), alpha=0.15,
                          linewidth=0, gid=f"{link} band", **style)


def draw_points(axis, link, points):
    """Measured efficiency (filled, with bars over repeats) and the model's at each run (hollow)."""
    for point in points:
        x = point["world"] * SERIES_SHIFT[point["series"]]
        marker = SERIES_MARKERS[point["series"]]
        spread = point["measured"]
        axis.errorbar([x], medians([spread], 100), yerr=errors([spread], 100), fmt=marker,
                      color=LINK_COLOURS[link], markersize=6, capsize=2,
                      gid=f"measured {link} {point['series']} {point['world']}")
        if point["modelled"] is not None:
            axis.plot([x], [100 * point["modelled"]], marker, markerfacecolor="none",
                      color=LINK_COLOURS[link], markersize=9,
                      gid=f"modelled {link} {point['series']} {point['world']}")


def plot_projection(inputs):
    """The figure, one panel per model; None without a model to draw."""
    if not inputs["models"]:
        return None
    figure, axes = plt.subplots(1, len(inputs["models"]), figsize=(6 * len(inputs["models"]), 4.8),
                                sharey=True, squeeze=False)
    for axis, (name, model) in zip(axes[0], inputs["models"].items()):
        for link, fitted in inputs["links"].items():
            draw_link(axis, model, link, fitted)
            draw_points(axis, link, model["points"].get(link, []))
        axis.set_xscale("log", base=2)
        axis.set_xticks(cost_model.FIGURE_WORLD_SIZES, map(str, cost_model.FIGURE_WORLD_SIZES))
        axis.set_xlim(1.6, 1300)
        axis.set_ylim(0, 102)
        axis.set_title(f"{name.upper()}: projected efficiency "
                       "(solid ring, dashed halving-doubling)", fontsize=9)
        axis.set_xlabel("ranks")
        axis.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("efficiency: compute / (compute + exposed comm), %")
    axes[0][-1].fill_between([], [], [], color="tab:gray", alpha=0.15,
                             label="95 % of the fit's bootstrap resamples")
    for series, marker in SERIES_MARKERS.items():
        axes[0][-1].plot([], [], marker, color="black", label=f"{series}: measured (filled), "
                                                              "model at its compute (hollow)")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    return figure
