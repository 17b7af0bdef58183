"""--mode sharded from the command line: ZeRO-1, 2 and 3 (manual_sharding.py behind
runtime/sharded.py) train as --mode manual does, resume from their checkpoints at the same or at
another world size, record what each rank holds, and refuse what they cannot do.

Every run is a fresh `python mlp_ddp.py` on one small dataset; a run that several tests read is
made once (`Runs`)."""
import collections
import json
import shutil

import pytest
import torch

import mlp_ddp
from grading.launch import run_cli, run_ok
from runtime import results
from tests.harness import one_line_exit_2, write_dataset

# SGD without dropout: ranks at another world size draw no masks to match, and rounding that
# differs with the batch split stays rounding (Adam can turn it into a step of the learning rate).
# Momentum is the optimizer state that is sharded, checkpointed and resharded.
COMMON = ("--val-samples", 100, "--epochs", 2, "--max-steps", 5, "--dropout", 0,
          "--optimizer", "sgd", "--lr", 0.05, "--warmup-steps", 1, "--progress-every", 1000)
TWO = ("--world-size", 2, "--batch-size", 24)
THREE = ("--world-size", 3, "--batch-size", 16)  # the same global batch: the same samples per step
LEVELS = ("optimizer", "gradients", "parameters")
# ZeRO-1 through the lesson's ring reduce-scatter and all-gather; ZeRO-2 through gloo's, in buckets
# of 0.5 MiB (the first layer's weight alone, the other layers together); ZeRO-3 as it comes
# (--transport auto: shared memory, the ranks sharing this host)
LEVEL_OPTIONS = {"optimizer": ("--transport", "ring"),
                 "gradients": ("--bucket-mb", 0.5, "--transport", "library"), "parameters": ()}
MID_RUN = "ckpt-e0000-s00000003.pt"  # after step 3 of epoch 1 (--checkpoint-every 3)


class Runs:
    """mlp_ddp.py runs in one folder, each made once and read by every test that needs it: its
    results document and the parameters it saved (--save-model)."""

    def __init__(self, folder):
        self.folder = folder
        # 2,001 test images: 1,000 and 1,001 at 2 ranks, so only rank 1 has a second batch of
        # evaluation. ZeRO-3's forward is a collective: every rank must run as many batches.
        self.data = write_dataset(str(folder / "data"), test=2001)
        self.done = {}

    def __call__(self, name, *args):
        if name not in self.done:
            run_ok("--data-dir", self.data, *args, "--results-dir", self.folder,
                   "--run-name", name, "--save-model", self.folder / f"{name}.pt")
            document = json.loads((self.folder / f"{name}.json").read_text())
            self.done[name] = document, torch.load(self.folder / f"{name}.pt")
        return self.done[name]

    def manual(self):
        return self("manual", "--mode", "manual", *TWO, *COMMON)

    def level(self, level):
        """A run of `level` at 2 ranks that checkpoints every 3 steps and keeps them all, and
        traces its first steps."""
        return self(level, "--mode", "sharded", "--shard", level, *TWO, *COMMON,
                    *LEVEL_OPTIONS[level], *self.checkpoints(level),
                    "--trace", self.folder / f"{level}-trace.json", "--trace-steps", 2)

    def checkpoints(self, level):
        return ("--checkpoint-dir", self.folder / f"ckpt-{level}", "--checkpoint-every", 3,
                "--keep-checkpoints", 10)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return Runs(tmp_path_factory.mktemp("sharding"))


def assert_close(left, right):
    """The same parameters up to float32 rounding."""
    assert left.keys() == right.keys()
    for key in left:
        torch.testing.assert_close(left[key], right[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.rubric("core.end_to_end")
@pytest.mark.parametrize("level", LEVELS)
def test_each_level_trains_to_the_accuracy_and_parameters_of_mode_manual(runs, level):
    manual, manual_parameters = runs.manual()
    sharded, sharded_parameters = runs.level(level)
    # the main job still learns this data
    assert manual["test"]["accuracy"] >= 0.9
    # the same accuracy, epoch by epoch and on the test split
    assert sharded["test"]["accuracy"] == manual["test"]["accuracy"]
    for ours, theirs in zip(sharded["epochs"], manual["epochs"], strict=True):
        assert ours["val_accuracy"] == theirs["val_accuracy"]
        assert ours["train_loss"] == pytest.approx(theirs["train_loss"], rel=1e-5)
    # and the same whole model, gathered by --save-model
    assert_close(sharded_parameters, manual_parameters)
    assert sharded["config"]["shard"] == level


def test_ranks_of_one_host_shard_through_shared_memory_by_default_and_send_nothing_on_the_wire(
        runs):
    shared, _ = runs.level("parameters")
    assert shared["config"]["transport"] == "auto"
    # the ranks of one host exchange through memory: no byte leaves a rank
    for sent in shared["timing"]["bytes_sent"]["per_rank"]:
        assert sent["transport"] == "shared-memory" and sent["measured_per_step"] == 0


@pytest.mark.rubric("core.end_to_end")
def test_zero_3_computing_in_bfloat16_learns_and_sends_half_the_bytes(runs):
    manual, _ = runs.manual()
    float32, float32_parameters = runs.level("parameters")
    bfloat16, bfloat16_parameters = runs("bf16", "--mode", "sharded", "--compute-dtype", "bf16",
                                         "--no-prefetch", *TWO, *COMMON)
    assert bfloat16["config"]["compute_dtype"] == "bf16"
    assert bfloat16["config"]["prefetch"] is False
    assert bfloat16["test"]["accuracy"] >= manual["test"]["accuracy"] - 0.02
    # the float32 master shards moved by bfloat16 gradients: near, not equal
    for key, value in float32_parameters.items():
        assert bfloat16_parameters[key].dtype == torch.float32
        torch.testing.assert_close(bfloat16_parameters[key], value, rtol=0, atol=2e-2, msg=key)
    # the same all-gathers and reduce-scatters (without prefetch in another order), at half the
    # bytes
    (float32_layout,) = float32["timing"]["all_reduce_layouts"]
    (bfloat16_layout,) = bfloat16["timing"]["all_reduce_layouts"]
    assert sorted(bfloat16_layout["bytes"]) == sorted(size // 2 for size in float32_layout["bytes"])


@pytest.mark.rubric("core.end_to_end")
def test_a_zero_2_run_killed_mid_epoch_resumes_from_its_checkpoint_with_the_same_parameters(
        runs, tmp_path):
    _, uninterrupted = runs.level("gradients")
    options = ("--data-dir", runs.data, "--mode", "sharded", "--shard", "gradients", *TWO,
               *COMMON, *LEVEL_OPTIONS["gradients"], "--results-dir", tmp_path,
               "--checkpoint-dir", tmp_path / "ckpt", "--checkpoint-every", 3)
    crashed = run_cli(*options, "--debug-exit-rank", 1, "--debug-exit-step", 7)
    assert crashed.returncode == 3 and "exiting at step 7" in crashed.stderr
    done = run_ok(*options, "--resume", "--save-model", tmp_path / "resumed.pt")
    assert f"resumed from {tmp_path / 'ckpt' / 'ckpt-e0001-s00000001.pt'}" in done.stdout
    # bit for bit: each rank took back its shard of the momentum, and the schedule's step
    resumed = torch.load(tmp_path / "resumed.pt")
    for key, value in uninterrupted.items():
        assert torch.equal(resumed[key], value), key


# ZeRO-2's optimizer state is ZeRO-1's, in more shards: resumed above
@pytest.mark.rubric("core.end_to_end")
@pytest.mark.parametrize("level", ["optimizer", "parameters"])
def test_a_checkpoint_from_2_ranks_resumes_at_3_with_the_parameters_of_an_uninterrupted_run(
        runs, level, tmp_path):
    _, uninterrupted = runs.level(level)
    saved = runs.folder / f"ckpt-{level}" / MID_RUN
    # what was saved is whole: every parameter at its full shape, the momentum at full length
    state = torch.load(saved)
    assert {key: value.shape for key, value in state["model"].items()} == \
        {key: value.shape for key, value in uninterrupted.items()}
    numel = sum(value.numel() for value in uninterrupted.values())
    momenta = [values["momentum_buffer"] for values in state["optimizer"]["state"].values()]
    assert sum(momentum.numel() for momentum in momenta) == numel
    (tmp_path / "ckpt").mkdir()
    shutil.copy(saved, tmp_path / "ckpt")
    done = run_ok("--data-dir", runs.data, "--mode", "sharded", "--shard", level, *THREE,
                  *COMMON, *LEVEL_OPTIONS[level], "--results-dir", tmp_path, "--checkpoint-dir",
                  tmp_path / "ckpt", "--resume", "--save-model", tmp_path / "resumed.pt")
    assert "resumed from" in done.stdout
    # the same samples in every later step, summed over 3 ranks instead of 2: rounding apart
    assert_close(torch.load(tmp_path / "resumed.pt"), uninterrupted)


def test_a_sharded_checkpoint_resumed_in_another_mode_is_one_clear_line(runs, tmp_path):
    runs.level("parameters")
    (tmp_path / "ckpt").mkdir()
    shutil.copy(runs.folder / "ckpt-parameters" / MID_RUN, tmp_path / "ckpt")
    done = run_cli("--data-dir", runs.data, "--mode", "single", *COMMON, "--results-dir",
                   tmp_path, "--checkpoint-dir", tmp_path / "ckpt", "--resume")
    one_line_exit_2(done)
    assert "--shard parameters" in done.stderr and "per parameter" in done.stderr


@pytest.mark.rubric("core.end_to_end")
def test_the_results_record_what_each_rank_holds_zero_3_half_of_ddp_at_2_ranks(runs):
    ddp, ddp_parameters = runs("ddp", "--mode", "ddp", *TWO, *COMMON)
    documents = {level: runs.level(level)[0] for level in LEVELS}
    for document in (ddp, *documents.values()):
        assert results.validate(document) == []
        assert len(document["memory"]["per_rank"]) == 2
    whole = ddp["memory"]["per_rank"][0]
    assert whole["parameters"] == 4 * ddp["environment"]["parameters"]  # float32, one copy
    # what each level splits over the 2 ranks is half of DDP's (the shards padded to equal size)
    halved = {"optimizer": ["optimizer_state"],
              "gradients": ["optimizer_state", "gradients"],
              "parameters": ["optimizer_state", "gradients", "parameters"]}
    for level, categories in halved.items():
        for held in documents[level]["memory"]["per_rank"]:
            for category in categories:
                assert held[category] == pytest.approx(whole[category] / 2, rel=1e-3), \
                    (level, category)
    # at its most ZeRO-3 holds a layer gathered whole with its whole gradients, where at the step
    # it holds the gradients' shards: the largest layer's bytes more, at least; DDP's most is at
    # the step
    layers = collections.Counter()
    for key, value in ddp_parameters.items():
        layers[key.rsplit(".", 1)[0]] += 4 * value.numel()
    assert whole["model_states_peak"] == whole["model_states"]
    for held in documents["parameters"]["memory"]["per_rank"]:
        assert held["model_states_peak"] >= held["model_states"] + max(layers.values())
    assert documents["parameters"]["config"]["shard"] == "parameters"
    assert ddp["config"]["shard"] is None  # not a sharded run
    # the record is optional (results written before it have none) but checked when present
    del ddp["memory"]["per_rank"][1]
    assert "memory.per_rank does not have one entry per rank" in results.validate(ddp)
    del ddp["memory"]
    assert results.validate(ddp) == []


@pytest.mark.rubric("core.end_to_end")
def test_the_results_record_the_bytes_each_rank_sent_and_over_what_beside_the_rings(runs):
    ddp, _ = runs("ddp", "--mode", "ddp", *TWO, *COMMON)
    documents = {level: runs.level(level)[0] for level in LEVELS}
    for name, document in {"ddp": ddp, **documents}.items():
        for sent in document["timing"]["bytes_sent"]["per_rank"]:
            ring = sent["ring_formula_per_step"]
            if name == "optimizer":  # over the hand-written ring (LEVEL_OPTIONS): its bytes
                assert sent["transport"] == "point-to-point"
                assert sent["measured_per_step"] == ring
                continue
            if name == "parameters":  # through shared memory: none (the test above)
                continue
            assert sent["transport"] == "library"
            # gloo's all-reduce is a ring (DDP: as the formula); its reduce-scatter is a whole
            # all-reduce: ZeRO-2 sends 3/2 of the ring's bytes
            more = {"ddp": 1, "gradients": 3 / 2}[name]
            assert sent["measured_per_step"] == pytest.approx(more * ring, rel=1e-6), name
    # checked when present: a rank's record without its bytes is a problem
    del ddp["timing"]["bytes_sent"]["per_rank"][0]["measured_per_step"]
    assert any("bytes_sent.per_rank[0]" in problem for problem in results.validate(ddp))


@pytest.mark.rubric("core.end_to_end")
def test_the_trace_shows_sharding_collectives_on_the_communication_track_by_their_names(runs):
    runs.level("parameters")
    events = json.loads((runs.folder / "parameters-trace.json").read_text())["traceEvents"]
    tracks = {event["name"]: event["tid"] for event in events if event["ph"] == "X"}
    assert tracks["all-gather unit 0"] == 1 and tracks["reduce-scatter unit 3"] == 1
    assert tracks["backward"] == 0
    assert not any(name.startswith("all-reduce") for name in tracks)


REFUSED = {
    "--shard without --mode sharded": ("--shard", "optimizer"),
    "--compute-dtype without --mode sharded": ("--mode", "manual", "--compute-dtype", "bf16"),
    "--no-prefetch without --mode sharded": ("--no-prefetch",),
    "--compress with --mode sharded": ("--mode", "sharded", "--compress", "fp16"),
    "--amp fp16 with --mode sharded": ("--mode", "sharded", "--amp", "fp16"),
    "--compute-dtype with ZeRO-1": ("--mode", "sharded", "--shard", "optimizer",
                                    "--compute-dtype", "bf16"),
    "--no-prefetch with ZeRO-2": ("--mode", "sharded", "--shard", "gradients", "--no-prefetch"),
    "an unknown level": ("--mode", "sharded", "--shard", "everything"),
}


@pytest.mark.parametrize("args", REFUSED.values(), ids=REFUSED.keys())
def test_sharding_options_that_cannot_work_exit_2_with_one_line(args, capsys):
    # in this process: the options are checked before anything starts
    with pytest.raises(SystemExit) as exit_:
        mlp_ddp.main([str(arg) for arg in args])
    assert exit_.value.code == 2
    said = capsys.readouterr().err
    assert len(said.strip().splitlines()) == 1 and "Traceback" not in said, said


def test_amp_fp16_is_refused_saying_the_ranks_could_disagree_on_skipping_a_step(capsys):
    with pytest.raises(SystemExit):
        mlp_ddp.main(["--mode", "sharded", "--amp", "fp16"])
    said = capsys.readouterr().err
    assert "shard" in said and "skip" in said
