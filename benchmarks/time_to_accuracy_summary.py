"""time_to_accuracy.py's summary of its runs: per model and configuration the median time to
target and its ratio to the classic recipe's, as the results file's "summary" and as a printed
table with the target's verdict."""
import statistics

from benchmarks.classic_mnist import CLASSIC

TARGET_RATIO = 0.5  # our CNN's median time to target, as a fraction of the recipe's at most
TARGET = (f"our CNN's time to its target test accuracy is at most {TARGET_RATIO}x the classic "
          "recipe's")


def median_or_none(times):
    """The median of repeated times to target, a repeat that never reached it counting as
    infinitely slow; None when that median is infinite (or there are no repeats)."""
    if not times:
        return None
    middle = statistics.median(float("inf") if time is None else time for time in times)
    return None if middle == float("inf") else middle


def summarise(records, plan, targets):
    """Per model of `targets` ({model: target accuracy}) and per configuration, in the order of
    `plan` (the planned runs: (model, name, world size, options)): the median time to target, and
    its ratio to the recipe's median time to the same target."""
    rows = []
    for model, target in targets.items():
        classic = [record["time_to_target_s"][model] for record in records
                   if record["name"] == CLASSIC and model in record["time_to_target_s"]]
        classic_median = median_or_none(classic)
        groups = [(CLASSIC, 1, classic)] if classic else []
        for _, name, world, _ in plan:
            times = [record["time_to_target_s"][model] for record in records
                     if (record["model"], record["name"], record["world_size"])
                     == (model, name, world)]
            if times and (name, world) not in [(group[0], group[1]) for group in groups]:
                groups.append((name, world, times))
        for name, world, times in groups:
            median = median_or_none(times)
            ratio = None
            if median is not None and classic_median:
                ratio = median / classic_median
            rows.append({"model": model, "target": target, "name": name, "world_size": world,
                         "times_to_target_s": times, "median_time_to_target_s": median,
                         "ratio_to_classic": ratio})
    return rows


def print_summary(rows):
    """The medians and ratios as a table, then the target's verdict."""
    print(f"\n{'model':>5} {'target':>6} {'config':>10} {'world':>5} {'median s':>9} "
          f"{'x classic':>9}  repeats (s)")
    for row in rows:
        median = row["median_time_to_target_s"]
        median_text = "-" if median is None else f"{median:.1f}"
        ratio = row["ratio_to_classic"]
        ratio_text = "-" if ratio is None else f"{ratio:.2f}"
        times = ", ".join("-" if time is None else f"{time:.1f}"
                          for time in row["times_to_target_s"])
        print(f"{row['model']:>5} {100 * row['target']:>5.1f}% {row['name']:>10} "
              f"{row['world_size']:>5} {median_text:>9} {ratio_text:>9}  {times}")
    print("(training time to the first evaluation at or above the target, evaluation excluded;"
          " -: not reached)")
    print(f"\ntarget: {TARGET}")
    for row in rows:
        if row["model"] == "cnn" and row["name"] != CLASSIC:
            ratio = row["ratio_to_classic"]
            holds = ratio is not None and ratio <= TARGET_RATIO
            verdict = "holds" if holds else "does not hold"
            print(f"  {row['name']} world {row['world_size']}: {verdict}")
