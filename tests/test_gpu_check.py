"""benchmarks/gpu_check.py: what it plans for a GPU, and its dry run on the CPU."""
import json

from analysis import design_numbers
from analysis.design_end_to_end import gpu_section
from analysis.design_numbers import Numbers
from benchmarks import gpu_check
from grading.sandbox import run_interpreter

DRY_RUN = ("single-w1", "manual-flat-ring-w2-shared", "plain-loop", "time-to-accuracy")


def test_the_check_plans_every_mode_at_one_rank_then_two_and_four_sharing_the_gpu():
    names = [name for name, _ in gpu_check.planned_steps(gpu_check.parse_args([]))]
    assert names[:5] == [f"{mode}-w1" for mode in gpu_check.MODES_AT_ONE]
    assert {"manual-flat-ring-w2-shared", "ddp-w2-shared", "manual-bucketed-w4-shared",
            "ddp-w4-shared"} <= set(names)
    assert names[-2:] == ["plain-loop", "time-to-accuracy"]
    for _, argv in gpu_check.planned_steps(gpu_check.parse_args([])):
        assert argv[argv.index("--device") + 1] == "cuda"  # every step on the GPU


def test_the_dry_run_on_the_cpu_runs_each_kind_of_step_and_reads_it_back(tiny_data, tmp_path):
    # one step of each kind: a run alone, ranks sharing, the plain loop, the race to 99 %
    done = run_interpreter(["-m", "benchmarks.gpu_check", str(tmp_path / "gpu"), "--device", "cpu",
                       "--quick", "--data-dir", tiny_data, "--only", ",".join(DRY_RUN)],
                      timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "gpu" / "summary.json").read_text())
    assert [step["name"] for step in summary["steps"]] == list(DRY_RUN)
    assert all(step["status"] == "ok" for step in summary["steps"])
    figures = summary["figures"]
    assert {(run["run"], run["device"], run["world_size"]) for run in figures["runs"]} == \
        {("single-w1", "cpu", 1), ("manual-flat-ring-w2-shared", "cpu", 2)}
    assert {ratio["configuration"] for ratio in figures["step_against_plain_loop"]} == \
        {"single", "ddp", "manual"}
    assert {run["name"] for run in figures["cnn_time_to_99"]} == {"classic", "single"}
    # the design document reports no dry run; a run on a GPU becomes §4.7's tables, each number
    # read from summary.json
    dry = gpu_section(Numbers(), str(tmp_path))["text.gpu"]
    assert "is a dry run" in dry and "|" not in dry
    summary.update(quick=False, device="cuda")
    (tmp_path / "gpu" / "summary.json").write_text(json.dumps(summary))
    design_numbers.loaded.clear()
    numbers = Numbers()
    text = gpu_section(numbers, str(tmp_path))["text.gpu"]
    index, run = next((index, run) for index, run in enumerate(figures["runs"])
                      if run["run"] == "single-w1")
    accuracy = numbers.entries[f"gpu.runs.{index}.test_accuracy"]
    assert (accuracy["field"], accuracy["value"]) == (f"figures.runs[{index}].test_accuracy",
                                                      run["test_accuracy"])
    assert f"| single-w1 | cpu | {run['backend']} | {accuracy['text']} |" in text
    assert "| classic |" in text and "× plain loop" in text
