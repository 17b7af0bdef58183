"""§4.6's end-to-end answer and §4.7's GPU: the time to a target accuracy of pytorch/examples'
recipe and of ours at 1, 2 and 4 processes (benchmarks/time_to_accuracy.py), and what
benchmarks/gpu_check.py measured on a GPU, once results/gpu/summary.json holds a real run."""
import os

from analysis.design_numbers import headers, read_results, repo_relative, table

# (name, processes) of the runs §4.6 quotes: the recipe, ours alone, ours over shared memory
TIME_TO_ACCURACY_ROWS = (("classic", 1), ("single", 1), ("flat-shm", 2), ("flat-shm", 4))
SHOWN_AS = {"classic": "pytorch/examples' recipe", "single": "ours, one process"}
# §4.7's tables: (caption, the list of summary.json's figures, columns: (header, field, unit or None
# for a name shown as it is))
GPU_TABLES = (("Every mode, one epoch of the MLP:", "runs", (
                  ("run", "run", None), ("device", "device", None), ("backend", "backend", None),
                  ("test accuracy", "test_accuracy", "percent"),
                  ("samples/s", "samples_per_s", "samples/s"),
                  ("median step", "median_step_s", "ms"))),
              ("Our step over a plain PyTorch loop's (the goal is at most 1.2×):",
               "step_against_plain_loop", (("model", "model", None),
                                           ("configuration", "configuration", None),
                                           ("× plain loop", "ratio_to_plain", "ratio"))),
              ("The CNN's training time to 99 % on the same GPU (pytorch/examples' recipe: "
               "classic):", "cnn_time_to_99", (("run", "name", None),
                                              ("seconds to 99 %", "time_to_target_s", "s"))))


def time_to_accuracy_section(numbers, results_dir):
    """Per model and run of TIME_TO_ACCURACY_ROWS: its seconds to the target over the repeats
    ('tta.<model>.<name>.w<n>.time') and over ours alone in the same repeat ('.vs_single', its
    claim 'text.tta.<model>.<name>.w<n>.vs_single')."""
    path = os.path.join(results_dir, "time-to-accuracy.json")
    document, problem = read_results(path, "time-to-accuracy/1",
                                     "python -m benchmarks.time_to_accuracy")
    runs = document.get("runs", [])
    numbers.measured("tta.repeats", path if document else None, "config.repeats", "count")
    rows, claims = [], {}
    for model in ("mlp", "cnn"):
        numbers.measured(f"tta.{model}.target", path if document else None, f"targets.{model}",
                         "percent")
        repeats = {(run["name"], run["world_size"]): {} for run in runs}
        for index, run in enumerate(runs):  # the recipe's runs (no model) serve both targets
            if run["model"] in (None, model):
                repeats[run["name"], run["world_size"]][run["repeat"]] = index
        alone = repeats.get(("single", 1), {})
        for name, world in TIME_TO_ACCURACY_ROWS:
            key, field = f"tta.{model}.{name}.w{world}", f"time_to_target_s.{model}"
            mine = repeats.get((name, world), {})
            numbers.spread_of(f"{key}.time", [f"{path}#runs[{index}].{field}"
                                              for index in mine.values()], "s",
                              "the training seconds to the first evaluation at the target")
            numbers.paired_values(f"{key}.vs_single", [
                f"{path}#runs[{index}].{field}" for repeat in sorted(mine) if repeat in alone
                for index in (mine[repeat], alone[repeat])], "ratio", 1.0,
                "the time to target / ours alone, within each repeat",
                verdict=f"{key}.vs_single.verdict")
            against = "—" if name == "single" else numbers.claim(f"{key}.vs_single",
                                                                 f"{key}.vs_single.verdict")
            claims[f"text.{key}.vs_single"] = against
            shown = SHOWN_AS.get(name, f"ours, {world} processes, {name}")
            rows.append([f"{model.upper()} to {numbers.text(f'tta.{model}.target')}", shown,
                         numbers.spread_text(f"{key}.time"), against])
    return {**claims, "table.time_to_accuracy": problem or table(
        ["target", "run", "seconds to target", "÷ ours alone, per repeat"], rows)}


def gpu_section(numbers, results_dir):
    """§4.7: GPU_TABLES from the GPU check's summary.json, or a line saying how to make them; a dry
    run (--quick, or on the CPU) is not reported."""
    path = os.path.join(results_dir, "gpu", "summary.json")
    document, problem = read_results(path, "gpu-check/1", "python -m benchmarks.gpu_check on a "
                                     "GPU machine (it writes results/gpu/)")
    if problem or document["quick"] or document["device"] != "cuda":
        return {"text.gpu": problem or f"*{repo_relative(path)} is a dry run (--quick or on the "
                                       "CPU): run python -m benchmarks.gpu_check on a GPU.*"}
    parts = []
    for caption, listed, columns in GPU_TABLES:
        rows = []
        for index, row in enumerate(document["figures"][listed]):
            rows.append([])
            for _, field, unit in columns:
                name = f"gpu.{listed}.{index}.{field}"
                if unit:
                    numbers.measured(name, path, f"figures.{listed}[{index}].{field}", unit)
                rows[-1].append(numbers.text(name) if unit else row[field])
        parts += [caption, table(headers(columns), rows)]
    return {"text.gpu": "\n\n".join(parts)}
