"""When ranks part ways, the run says where: every rank's collectives are recorded
(runtime/collective_record.py) and the first place they disagree is named, with each rank's line
(runtime/hang_verdict.py), in the tests' failures and in a run that hangs; and ranks whose
parameters drift apart stop at the next check, naming the parameter (runtime/guards.py,
--check-sync-every).
"""
import inspect
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from grading.launch import ChildFailed, run_cli, run_in_processes, without_offline_data
from runtime import collective_record, hang_verdict
from tests.harness import REPO, write_dataset

FLOATS = torch.zeros(1024)


def records_of(folder, *ranks):
    """A Recorder per rank in `folder`, written from this process, as the ranks would."""
    return [collective_record.Recorder(str(folder), rank) for rank in ranks]


def verdict_of(folder):
    """The verdict of the records in `folder`, without the lines that started each collective
    (test_each_rank_is_named_at_the_line_that_started_its_collective checks those)."""
    verdict = hang_verdict.compare(hang_verdict.read_records(folder))
    return verdict and re.sub(r" at \S+ \([^)]*\)", "", verdict)


def test_ranks_that_agree_and_wait_for_nothing_give_no_verdict(tmp_path):
    for rank, recorder in enumerate(records_of(tmp_path, 0, 1)):
        recorder.finish(recorder.start("all_reduce", FLOATS, None))
        # a ring's messages differ in size from rank to rank: compared by operation only
        recorder.finish(recorder.start("isend", torch.zeros(3 + rank), 1 - rank))
    assert hang_verdict.compare(hang_verdict.read_records(tmp_path)) is None


def test_ranks_that_each_wait_to_receive_are_said_to_wait_for_each_other_in_a_cycle(tmp_path):
    first, second = records_of(tmp_path, 0, 1)
    first.start("recv", FLOATS, 1)
    second.start("irecv", FLOATS, 0)
    assert verdict_of(tmp_path) == (
        "collective #0: rank 0 waits in recv (1,024 float32 from rank 1); "
        "rank 1 waits in irecv (1,024 float32 from rank 0)\n" + hang_verdict.CYCLE)


def started_here(recorder):
    """Starts a receive from rank 1 in `recorder`: the line the verdict must name."""
    recorder.start("recv", FLOATS, 1)


def test_each_rank_is_named_at_the_line_that_started_its_collective(tmp_path):
    first, second = records_of(tmp_path, 0, 1)
    started_here(first)
    started_here(second)
    verdict = hang_verdict.compare(hang_verdict.read_records(tmp_path))
    source, first = inspect.getsourcelines(started_here)
    line = first + len(source) - 1  # its last line
    where = f"at started_here (tests/test_collective_record.py:{line})"
    assert verdict.startswith(f"collective #0: rank 0 waits in recv (1,024 float32 from rank 1) "
                              f"{where}; rank 1 waits in recv"), verdict
    assert verdict.count(where) == 2, verdict


def sent_through_the_layers(recorder):
    """An all-reduce through the record's layer and the timing layer, as the runtime hands one to a
    strategy; the line that calls it is the one to name."""
    from manual_allreduce import completed
    from runtime import timing

    collective = collective_record.recorded(completed, recorder, "all_reduce")
    timing.timed(collective, timing.CommRecorder())(FLOATS).wait()


def test_the_line_named_is_the_callers_not_the_layers_the_runtime_put_around_it(tmp_path):
    recorder, = records_of(tmp_path, 0)
    sent_through_the_layers(recorder)
    entry, = hang_verdict.read_records(tmp_path)[0]
    source, first = inspect.getsourcelines(sent_through_the_layers)
    line = first + next(index for index, text in enumerate(source) if "timing.timed(" in text)
    assert entry["where"].decode() == (f"sent_through_the_layers "
                                       f"(tests/test_collective_record.py:{line})")


# The entry script calls the runtime, which sums over the ranks: the runtime's line is named.
SUM_FROM_THE_ENTRY_SCRIPT = """
import sys, torch.distributed as dist
from runtime import across_ranks, collective_record, hang_verdict
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0,
                        world_size=1)
collective_record.install(sys.argv[1], 0)
across_ranks.sum_over_ranks({"one": 1}, "cpu")
print(hang_verdict.read_records(sys.argv[1])[0][0]["where"].decode())
dist.destroy_process_group()  # else gloo's threads may abort the exit (SIGABRT), now and then
"""


def test_a_collective_of_the_runtime_called_from_the_entry_script_is_named_at_the_runtime(
        tmp_path):
    from runtime.launch import free_port

    done = subprocess.run([sys.executable, "-c", SUM_FROM_THE_ENTRY_SCRIPT, str(tmp_path),
                           str(free_port())], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sum_over_ranks (runtime/across_ranks.py:"), done.stdout


def test_the_verdict_names_the_first_collective_where_the_ranks_part_ways(tmp_path):
    first, second = records_of(tmp_path, 0, 1)
    for recorder in (first, second):
        recorder.finish(recorder.start("all_reduce", FLOATS, None))
    first.start("recv", FLOATS, 1)  # waits
    second.finish(second.start("reduce_scatter_tensor", FLOATS[:512], None))
    assert verdict_of(tmp_path) == (
        "collective #1: rank 0 waits in recv (1,024 float32 from rank 1); "
        "rank 1 did reduce_scatter_tensor (512 float32)\nthe ranks took different paths")


def test_a_rank_that_went_no_further_is_named_with_its_last_collective(tmp_path):
    first, second = records_of(tmp_path, 0, 1)
    for recorder in (first, second):
        recorder.finish(recorder.start("all_reduce", FLOATS, None))
    first.start("all_reduce", FLOATS.half(), None)
    assert verdict_of(tmp_path) == ("collective #1: rank 0 waits in all_reduce (1,024 float16); "
                                    "rank 1 started no collective after all_reduce #0\n"
                                    "the ranks took different paths")


def test_only_the_last_entries_are_kept_and_compared(tmp_path):
    first, second = records_of(tmp_path, 0, 1)
    for _ in range(collective_record.RING + 5):
        for recorder in (first, second):
            recorder.finish(recorder.start("broadcast", FLOATS, None))
    second.start("barrier", None, None)
    last = collective_record.RING + 4
    assert verdict_of(tmp_path) == (f"collective #{last + 1}: rank 0 started no collective after "
                                    f"broadcast #{last}; rank 1 waits in barrier (-)\n"
                                    "the ranks took different paths")


def test_a_record_that_is_not_a_regular_file_is_not_read(tmp_path):
    os.mkfifo(tmp_path / "rank-0.record")  # reading it would block the reader
    (tmp_path / "rank-1.record").symlink_to("/etc/hostname")
    assert hang_verdict.read_records(tmp_path) == {}


def mismatched(rank, world_size):
    """Rank 0 all-reduces, rank 1 broadcasts: each waits for the other."""
    tensor = torch.ones(8)
    if rank == 0:
        dist.all_reduce(tensor)
    else:
        dist.broadcast(tensor, 1)


def test_a_launch_whose_ranks_deadlock_fails_within_its_timeout_naming_where_each_waits():
    started = time.monotonic()
    with pytest.raises(ChildFailed) as failure:
        run_in_processes(2, mismatched, timeout_s=3)
    assert time.monotonic() - started < 20
    assert ("the ranks' collectives: collective #0: rank 0 waits in all_reduce (8 float32) at "
            "mismatched (tests/test_collective_record.py:") in str(failure.value)
    assert "rank 1 waits in broadcast (8 float32) at mismatched" in str(failure.value)
    assert str(failure.value).endswith("the ranks took different paths")


def waits_alone(rank, world_size, folder):
    """Rank 0 waits in a collective that rank 1 never joins; rank 0's record watches for it."""
    recorder = collective_record.install(folder, rank, operations=collective_record.OPERATIONS)
    hang_verdict.watch_from_now_on(recorder, 1)
    if rank == 0:
        dist.all_reduce(torch.ones(4))
    else:
        time.sleep(30)


def test_a_collective_in_flight_past_the_hang_timeout_ends_the_rank_with_the_verdict(
        tmp_path, capsys):
    folder = tmp_path / "records"
    folder.mkdir(mode=0o777)
    started = time.monotonic()
    with pytest.raises(ChildFailed, match="exit code 4"):
        run_in_processes(2, waits_alone, str(folder), timeout_s=30)
    assert time.monotonic() - started < 20  # not the process group's 30 s
    printed = capsys.readouterr().out
    assert "error: rank 0: a collective has waited" in printed
    assert ("collective #0: rank 0 waits in all_reduce (4 float32) at waits_alone "
            "(tests/test_collective_record.py:") in printed
    assert "rank 1 started no collective" in printed


def test_a_run_whose_rank_skips_an_all_reduce_stops_naming_both_ranks_positions(tmp_path):
    data = write_dataset(str(tmp_path), train=400, test=100)
    started = time.monotonic()
    done = run_cli("--data-dir", data, "--mode", "manual", "--sync", "flat", "--world-size", 2,
                   "--epochs", 1, "--batch-size", 16, "--val-samples", 50, "--warmup-steps", 1,
                   "--results-dir", tmp_path / "results", "--hang-timeout", 5,
                   "--debug-exit-rank", 1, "--debug-skip-all-reduce", 3, timeout=120)
    assert done.returncode != 0
    assert time.monotonic() - started < 60
    assert "rank 1: skipping all_reduce #3" in done.stderr
    verdict = [line for line in done.stderr.splitlines() if line.startswith("collective #")]
    assert len(verdict) == 1, done.stderr
    assert "rank 0 " in verdict[0] and "rank 1 " in verdict[0], verdict


@pytest.mark.parametrize("mode", [("--mode", "manual", "--sync", "per-param"),
                                  ("--mode", "manual", "--sync", "flat")])
def test_a_sync_that_leaves_a_parameter_out_stops_at_the_first_check_naming_it(tmp_path, mode):
    data = write_dataset(str(tmp_path), train=400, test=100)
    done = run_cli("--data-dir", data, *mode, "--world-size", 2, "--epochs", 1,
                   "--batch-size", 16, "--val-samples", 50, "--warmup-steps", 1,
                   "--results-dir", tmp_path / "results", "--check-sync-every", 4,
                   "--debug-unsynced-parameter", "layers.4.bias", timeout=120)
    assert done.returncode == 1
    assert ("after step 4 the ranks' parameters differ, first 'layers.4.bias' (rank 1 against "
            "rank 0)") in done.stderr, done.stderr
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").iterdir())


def test_a_zero_3_run_whose_ranks_agree_passes_the_check_of_its_gathered_parameters(tmp_path):
    data = write_dataset(str(tmp_path), train=400, test=100)
    done = run_cli("--data-dir", data, "--mode", "sharded", "--shard", "parameters",
                   "--world-size", 2,
                   "--epochs", 1, "--batch-size", 16, "--val-samples", 50, "--warmup-steps", 1,
                   "--results-dir", tmp_path / "results", "--check-sync-every", 3, timeout=120)
    assert done.returncode == 0, done.stderr
    # the run's one interception of torch.distributed is said in its first lines, after the
    # line that says what runs where
    assert done.stdout.splitlines()[1] == collective_record.INTERCEPTION


def halves_through_shared_memory(rank, world_size, folder):
    """The operations a record keeps of one reduce-scatter and one all-gather through shared
    memory, as the runtime hands them to a sharded strategy: (operation, elements, finished)."""
    from runtime.sharded import collectives

    recorder = collective_record.install(folder, rank)
    made = collectives("shm", record=recorder)
    tensor, shard = torch.ones(8), torch.empty(4)
    made["reduce_scatter"](shard, tensor).wait()
    made["all_gather"](tensor, shard).wait()
    return [(collective_record.OPERATIONS[entry["operation"]], int(entry["elements"]),
             bool(entry["finished"] > 0)) for entry in hang_verdict.read_records(folder)[rank]]


def test_the_shared_memory_halves_are_kept_in_the_record(tmp_path):
    folder = tmp_path / "records"
    folder.mkdir(mode=0o777)
    for kept in run_in_processes(2, halves_through_shared_memory, str(folder)):
        assert kept == [("reduce_scatter", 8, True), ("all_gather", 8, True)]


def test_the_check_is_on_by_default_where_the_sync_is_written_by_hand():
    from runtime.options import parse_args
    every = {mode: parse_args(["--mode", mode]).check_sync_every
             for mode in ("single", "ddp", "manual", "sharded")}
    assert every == {"single": 0, "ddp": 0, "manual": 100, "sharded": 100}


# The lesson's ring all-gather, receiving before it sends: every rank waits for its left
# neighbour, which waits for its own. Planted in a copy of the project.
IN_ORDER = ("        request = dist.isend(chunks[(rank - step) % world], right)\n"
            "        dist.recv(chunks[(rank - step - 1) % world], left)\n")
RECEIVE_FIRST = ("        dist.recv(chunks[(rank - step - 1) % world], left)  # planted\n"
                 "        request = dist.isend(chunks[(rank - step) % world], right)\n")


def project_with_a_deadlocked_ring_all_gather(folder):
    """A copy of what mlp_ddp.py runs, in `folder`, its ring_all_gather deadlocked; returns the
    line of the receive that waits."""
    for name in ("mlp_ddp.py", "manual_allreduce.py", "manual_collectives.py"):
        shutil.copy(os.path.join(REPO, name), folder)
    shutil.copytree(os.path.join(REPO, "runtime"), folder / "runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(REPO, "manual_sharding.py")) as file:
        source = file.read()
    assert IN_ORDER in source, "the ring all-gather's exchange changed: update IN_ORDER"
    (folder / "manual_sharding.py").write_text(source.replace(IN_ORDER, RECEIVE_FIRST))
    return source[:source.index(IN_ORDER)].count("\n") + 1


def test_a_ring_whose_ranks_all_wait_to_receive_stops_naming_the_line_and_the_cycle(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    line = project_with_a_deadlocked_ring_all_gather(project)
    data = write_dataset(str(tmp_path / "data"), train=400, test=100)
    started = time.monotonic()
    command = [sys.executable, "mlp_ddp.py", "--mode", "sharded", "--shard", "optimizer",
               "--transport", "ring", "--world-size", 2, "--hang-timeout", 3, "--epochs", 1,
               "--data-dir", data, "--batch-size", 16, "--val-samples", 50,
               "--results-dir", tmp_path / "results"]
    done = subprocess.run(list(map(str, command)), cwd=project, capture_output=True, text=True,
                          timeout=120, env={**without_offline_data(), "PYTHONPATH": str(project)})
    assert done.returncode == hang_verdict.HUNG_EXIT_CODE, done.stderr
    assert time.monotonic() - started < 60
    # the rank the watch ended first says where it waits
    where = f"ring_all_gather (manual_sharding.py:{line})"
    assert re.search(rf"a collective has waited \d+ s \(--hang-timeout 3\) at {re.escape(where)}",
                     done.stderr), done.stderr
    # the verdict names each rank at that line, and reads the cycle on the next
    lines = done.stderr.splitlines()
    verdict = [index for index, text in enumerate(lines) if text.startswith("collective #")]
    assert len(verdict) == 1, done.stderr
    assert lines[verdict[0]].count("waits in recv (") == 2, done.stderr
    assert lines[verdict[0]].count(f"at {where}") == 2, done.stderr
    assert lines[verdict[0] + 1] == hang_verdict.CYCLE
    assert "took different paths" not in done.stderr
