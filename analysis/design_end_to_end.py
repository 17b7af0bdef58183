"""§4.6's end-to-end answer and §4.7's GPU: the time to a target accuracy of pytorch/examples'
recipe and of ours at 1, 2 and 4 processes (benchmarks/time_to_accuracy.py), and what
benchmarks/gpu_check.py measured on a GPU, once results/gpu/summary.json holds a real run."""
import os

from analysis.design_numbers import read_results, table

# (name, processes) of the runs §4.6 quotes: the recipe, ours alone, ours over shared memory
TIME_TO_ACCURACY_ROWS = (("classic", 1), ("single", 1), ("flat-shm", 2), ("flat-shm", 4))
SHOWN_AS = {"classic": "pytorch/examples' recipe", "single": "ours, one process"}


def time_to_accuracy_section(numbers, results_dir):
    """Per model and run of TIME_TO_ACCURACY_ROWS: its seconds to the target over the repeats
    ('tta.<model>.<name>.w<n>.time') and over ours alone in the same repeat ('.vs_single')."""
    path = os.path.join(results_dir, "time-to-accuracy.json")
    document, problem = read_results(path, "time-to-accuracy/1",
                                     "python -m benchmarks.time_to_accuracy")
    runs = document.get("runs", [])
    numbers.measured("tta.repeats", path if document else None, "config.repeats", "count")
    rows = []
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
                "the time to target / ours alone, within each repeat")
            numbers.verdict(f"{key}.vs_single.verdict", f"{key}.vs_single")
            against = "—" if name == "single" else numbers.claim(f"{key}.vs_single",
                                                                 f"{key}.vs_single.verdict")
            shown = SHOWN_AS.get(name, f"ours, {world} processes, {name}")
            rows.append([f"{model.upper()} to {numbers.text(f'tta.{model}.target')}", shown,
                         numbers.spread_text(f"{key}.time"), against])
    return {"table.time_to_accuracy": problem or table(
        ["target", "run", "seconds to target", "÷ ours alone, per repeat"], rows)}


def gpu_section(numbers, results_dir):
    """§4.7: the GPU check's runs, its step against a plain loop and its CNN's time to 99 %, or a
    line saying how to make them; a dry run (--quick, or on the CPU) is not reported."""
    path = os.path.join(results_dir, "gpu", "summary.json")
    document, problem = read_results(path, "gpu-check/1", "python -m benchmarks.gpu_check on a "
                                     "GPU machine (it writes results/gpu/)")
    if problem or document["quick"] or document["device"] != "cuda":
        return {"text.gpu": problem or f"*{path} is a dry run (--quick or on the CPU): run "
                                       "python -m benchmarks.gpu_check on a GPU machine.*"}
    figures = document["figures"]
    runs, steps, races = [], [], []
    for index, run in enumerate(figures["runs"]):
        key = f"gpu.{run['run']}"
        for name, unit in (("test_accuracy", "percent"), ("samples_per_s", "samples/s"),
                           ("median_step_s", "ms")):
            numbers.measured(f"{key}.{name}", path, f"figures.runs[{index}].{name}", unit)
        runs.append([run["run"], run["device"], run["backend"], *(numbers.text(
            f"{key}.{name}") for name in ("test_accuracy", "samples_per_s", "median_step_s"))])
    for index, ratio in enumerate(figures["step_against_plain_loop"]):
        key = f"gpu.{ratio['model']}.{ratio['configuration']}.vs_plain"
        numbers.measured(key, path, f"figures.step_against_plain_loop[{index}].ratio_to_plain",
                         "ratio")
        steps.append([ratio["model"].upper(), ratio["configuration"], numbers.text(key)])
    for index, race in enumerate(figures["cnn_time_to_99"]):
        numbers.measured(f"gpu.tta.{race['name']}", path,
                         f"figures.cnn_time_to_99[{index}].time_to_target_s", "s")
        races.append([SHOWN_AS.get(race["name"], race["name"]),
                      numbers.text(f"gpu.tta.{race['name']}")])
    return {"text.gpu": "\n\n".join([
        "Every mode, one epoch of the MLP:", table(["run", "device", "backend", "test accuracy",
                                                    "samples/s", "median step"], runs),
        "Our step over a plain PyTorch loop's (the goal is at most 1.2×):",
        table(["model", "configuration", "× plain loop"], steps),
        "The CNN's training time to 99 % on the same GPU:",
        table(["run", "seconds to 99 %"], races)])}
