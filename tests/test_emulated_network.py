"""The emulated network (runtime/shaped_links.py, asked for through runtime/emulated_network.py):
shaped for real, and gone after every run.

    sudo CI=true python -m pytest tests/test_emulated_network.py -v -p no:cacheprovider

Needs root and `ip`/`tc` (and, for the SLURM test, Slurm or apt-get); otherwise skipped, or failed
when CI is set. About 40 s on 2 cores: a 100mbit all-reduce, a Ctrl-C'd run, and a two-node
SLURM job on a shaped local cluster.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from benchmarks.common import time_blocking_all_reduce
from grading.launch import run_cli, run_python
from runtime import shaped_links, torch_compat
from runtime.launch import launch_local
from runtime.options import parse_args
from tests.harness import one_line_exit_2, write_dataset
from tests.test_slurm import SMALL_RUN, Cluster, cannot_set_up, daemons_of, free_port_triple

pytestmark = pytest.mark.rubric("core.end_to_end")

REPO = Path(__file__).resolve().parent.parent
RATE = "100mbit"  # low, so that the wire time dwarfs the CPU's share even on 2 busy cores
MESSAGE_BYTES = 8 * 2**20


@pytest.fixture(scope="module")
def root_with_tools():
    """Skip (fail under CI) where namespaces cannot be made."""
    try:
        shaped_links.check_usable()
    except shaped_links.NetworkUnavailable as error:
        cannot_set_up(str(error))


def left_of(tag):
    """Our namespaces and links of this tag still present, as 'kind name'."""
    return [entry for entry in shaped_links.ours() if entry.split()[1].startswith(tag)]


def timed_all_reduce(placement, args):
    """A rank of the shaping test: one warm-up, then an 8 MiB all-reduce timed from a barrier."""
    dist.init_process_group("gloo", init_method=f"tcp://{placement.master_addr}:"
                            f"{placement.master_port}", rank=placement.rank,
                            world_size=placement.world_size)
    dist.all_reduce(torch.ones(1024))  # connections made before the timing starts
    tensor = torch.ones(MESSAGE_BYTES // 4)
    seconds = time_blocking_all_reduce(tensor)
    report = {"seconds": seconds, "sum": tensor[0].item(), "namespace": os.readlink(
        "/proc/self/ns/net"), "interface": os.environ.get("GLOO_SOCKET_IFNAME")}
    Path(args.folder, f"{placement.rank}.json").write_text(json.dumps(report))
    torch_compat.destroy_process_group()


def test_an_all_reduce_between_two_namespaces_takes_the_wire_time_then_nothing_is_left(
        root_with_tools, tmp_path):
    args = SimpleNamespace(emulate_link=RATE, ranks_per_node=1, folder=str(tmp_path))
    assert launch_local(timed_all_reduce, 2, args) is None
    reports = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    # Each rank in a namespace of its own, not this process's, with gloo on the shaped interface.
    namespaces = {report["namespace"] for report in reports}
    assert len(namespaces) == 2 and os.readlink("/proc/self/ns/net") not in namespaces
    assert {report["interface"] for report in reports} == {shaped_links.INTERFACE}
    assert reports[0]["sum"] == 2.0
    # A 2-rank all-reduce must move 2(n-1)/n x N = N bytes across each link, each way; tbf lets
    # one burst through at once, the rest at the rate.
    bits_per_s = shaped_links.parse_rate(RATE)
    wire_s = (MESSAGE_BYTES - shaped_links.burst_bytes(bits_per_s)) * 8 / bits_per_s
    slowest = max(report["seconds"] for report in reports)
    assert slowest >= wire_s, f"{slowest:.3f} s < the wire time {wire_s:.3f} s: not shaped"
    assert left_of(f"{shaped_links.PREFIX}{os.getpid()}") == []
    assert not os.path.exists(f"/run/{shaped_links.PREFIX}{os.getpid()}.network")


@pytest.mark.parametrize("fail_at", [3, 6, 13])
def test_a_start_that_fails_midway_removes_what_it_made(root_with_tools, monkeypatch, fail_at):
    # 3: a namespace exists; 6: a veth too; 13: the second host half made
    monkeypatch.setenv(shaped_links.FAIL_HOOK, str(fail_at))
    tag = f"{shaped_links.PREFIX}t{os.getpid()}"
    network = shaped_links.EmulatedNetwork(tag, 2, RATE, record=f"/run/{tag}.network")
    with pytest.raises(shaped_links.NetworkUnavailable, match="on purpose"):
        with network:
            pass
    assert left_of(tag) == []
    assert not os.path.exists(network.record)


def test_ctrl_c_on_a_local_run_stops_every_rank_and_removes_the_network(root_with_tools,
                                                                          tmp_path):
    data = write_dataset(str(tmp_path / "data"), train=2048 + 256, test=512)
    command = [sys.executable, "mlp_ddp.py", "--world-size", "2", "--emulate-link", "1gbit",
               "--data-dir", data, "--train-samples", "2048", "--val-samples", "256",
               "--epochs", "50", "--results-dir", str(tmp_path / "results")]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    tag = f"{shaped_links.PREFIX}{run.pid}"
    # interrupt once training runs: an epoch line is printed after the first epoch
    deadline = time.monotonic() + 60
    while "epoch 1/" not in (line := run.stdout.readline()) and time.monotonic() < deadline:
        assert line or run.poll() is None, run.stderr.read()
    assert left_of(tag), "no network while the run was training"
    run.send_signal(signal.SIGINT)
    _, errors = run.communicate(timeout=30)
    assert run.returncode == 130, errors
    assert left_of(tag) == []


def test_emulate_link_with_a_bad_rate_is_one_line_and_exit_2():
    one_line_exit_2(run_cli("--world-size", "2", "--emulate-link", "1gbt", timeout=60))


def test_emulate_link_without_root_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as leaving:
        parse_args(["--world-size", "2", "--emulate-link", "1gbit"])
    assert leaving.value.code == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1 and "needs root" in error, error


def test_emulate_link_needs_a_local_launch_of_two_ranks(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--emulate-link", "1gbit"])
    assert "--world-size 2 or more" in capsys.readouterr().err


def test_the_benchmark_refuses_a_bad_rate_in_one_line():
    one_line_exit_2(run_python(["-m", "benchmarks.allreduce_bench", "--emulate-link", "fast"],
                               timeout=60))


# --- the local SLURM cluster on shaped links ------------------------------------------------------

@pytest.fixture(scope="module")
def shaped_cluster(root_with_tools):
    """slurm/start_local_cluster.sh --link-rate 1gbit, in its own folder, ports and subnet."""
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        cannot_set_up("Slurm is not installed and there is no apt-get to install it")
    directory = tempfile.mkdtemp(prefix="ddp-slurm-net-test-", dir="/tmp")
    os.chmod(directory, 0o755)  # munged must reach its folder
    port = free_port_triple()
    local = Cluster(directory, port)
    # its own subnet: a cluster of the user's may hold the default one
    local.env.update(SLURM_LOCAL_SUBNET=f"10.214.{port % 250}", PYTHON=sys.executable)
    local.tag = f"{shaped_links.PREFIX}s{port}"
    started = subprocess.run(["bash", "slurm/start_local_cluster.sh", "--link-rate", "1gbit"],
                             cwd=REPO, env=local.env, capture_output=True, text=True, timeout=300)
    if started.returncode != 0:
        local.script("stop_local_cluster.sh")
        shutil.rmtree(directory, ignore_errors=True)
        pytest.fail(f"start_local_cluster.sh --link-rate failed:\n{started.stdout}"
                    f"{started.stderr}")
    yield local
    stopped = local.script("stop_local_cluster.sh")
    daemons, network = daemons_of(directory), left_of(local.tag)
    shutil.rmtree(directory, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr
    assert not daemons and not network, f"left behind: {daemons} {network}"


def sent_bytes(device, namespace=None):
    """Bytes a device's root qdisc has sent."""
    inside = ["-n", namespace] if namespace else []
    shown = subprocess.run(["tc", *inside, "-s", "qdisc", "show", "dev", device],
                           capture_output=True, text=True, timeout=30).stdout
    return int(re.search(r"Sent (\d+) bytes", shown).group(1))


def test_a_two_node_job_on_shaped_links_completes_with_its_ranks_on_two_addresses(
        shaped_cluster, tmp_path):
    write_dataset(str(tmp_path / "data"), train=2048 + 256, test=512)
    job = shaped_cluster.submit("srun", SMALL_RUN + [
        "--data-dir", str(tmp_path / "data"), "--results-dir", str(tmp_path / "results"),
        "--run-name", "shaped"], tmp_path).wait()
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.text()
    subnet = shaped_cluster.env["SLURM_LOCAL_SUBNET"]
    results = json.loads((tmp_path / "results" / "shaped.json").read_text())
    assert results["environment"]["hosts"] == [f"{subnet}.1", f"{subnet}.2"]
    # The gradients crossed the shaped links: 16 steps x 2.3 MB of flat gradients, each way.
    for host in range(2):
        assert sent_bytes(f"{shaped_cluster.tag}h{host}") > 10e6
        assert sent_bytes(shaped_links.INTERFACE, f"{shaped_cluster.tag}-{host}") > 10e6


def test_a_cluster_start_with_a_bad_rate_or_a_failure_midway_leaves_nothing(root_with_tools):
    directory = tempfile.mkdtemp(prefix="ddp-slurm-net-fail-", dir="/tmp")
    os.chmod(directory, 0o755)
    port = free_port_triple()
    env = dict(os.environ, SLURM_LOCAL_DIR=directory, SLURM_LOCAL_PORT=str(port),
               SLURM_LOCAL_SUBNET=f"10.215.{port % 250}", PYTHON=sys.executable)
    try:
        for rate, fail_at in (("1gbt", None), ("1gbit", "8")):
            if fail_at:
                env[shaped_links.FAIL_HOOK] = fail_at
            started = subprocess.run(["bash", "slurm/start_local_cluster.sh", "--link-rate",
                                      rate], cwd=REPO, env=env, capture_output=True, text=True,
                                     timeout=300)
            assert started.returncode != 0
            assert len(started.stderr.strip().splitlines()) == 1, started.stderr
            assert left_of(f"{shaped_links.PREFIX}s{port}") == []
            assert daemons_of(directory) == []
    finally:
        shutil.rmtree(directory, ignore_errors=True)
