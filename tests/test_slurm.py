"""run_slurm.sh on a real Slurm: two nodes on this machine, started by slurm/start_local_cluster.sh.

    sudo python -m pytest tests/test_slurm.py -v

Needs root and apt-get (or Slurm and munge already installed); otherwise the tests are
skipped, or fail when CI is set, so a CI machine cannot pass them by skipping.
About a minute on 2 cores shared with other work: four jobs (both launch styles, succeeding
and failing) and the local reference run all run at once.
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from grading.launch import run_cli
from tests.harness import write_dataset

pytestmark = pytest.mark.rubric("core.end_to_end")

REPO = Path(__file__).resolve().parent.parent
NODES = ["127.0.0.1", "127.0.0.2"]
STYLES = ["srun", "torchrun"]
FLAT = ["--mode", "manual", "--sync", "flat"]
SMALL = ["--train-samples", "2048", "--val-samples", "256", "--test-samples", "512",
         "--epochs", "1", "--batch-size", "32", "--dropout", "0", "--seed", "0"]
SMALL_RUN = FLAT + SMALL
FINISHED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}
DAEMONS = ("munged", "slurmctld", "slurmd")
JOB_LIMIT_S = 180
FAILURE_LIMIT_S = 90


def cannot_set_up(reason):
    """Skip where a Slurm cluster cannot be set up; under CI that is a failure, not a pass."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
        pytest.fail(f"CI is set but the Slurm tests cannot run: {reason}")
    pytest.skip(reason)


def free_port_triple():
    """A port p such that p, p+1 and p+2 are free: slurmctld's and the two slurmd's."""
    for base in range(17817, 18817, 3):
        try:
            for port in range(base, base + 3):
                with socket.socket() as probe:
                    probe.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no three consecutive free ports in 17817-18816")


def process_state(proc):
    """The state letter in /proc/<pid>/stat, after the command name (which may hold spaces)."""
    _, after_name = (proc / "stat").read_text().rsplit(")", 1)
    state, *_ = after_name.split()
    return state


def daemons_of(cluster_dir):
    """Live (not zombie) munged/slurmctld/slurmd processes whose command line names
    cluster_dir."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or process_state(proc) == "Z":
                continue
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            daemon = (proc / "comm").read_text().strip() in DAEMONS
        except OSError:
            continue
        if str(cluster_dir) in command and daemon:
            found.append(command.strip())
    return found


class Cluster:
    """The local cluster of slurm/start_local_cluster.sh, in its own folder and ports."""

    def __init__(self, directory, port):
        self.dir = Path(directory)
        self.env = dict(os.environ, SLURM_LOCAL_DIR=str(directory), SLURM_LOCAL_PORT=str(port),
                        SLURM_LOCAL_CPUS="8", SLURM_CONF=str(Path(directory) / "slurm.conf"))

    def script(self, name, timeout=300):
        """Run one of slurm/*.sh for this cluster."""
        return subprocess.run(["bash", str(REPO / "slurm" / name)], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def slurm(self, *command):
        """Run a Slurm command (sinfo, scontrol, ...) against this cluster."""
        return subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=30)

    def submit(self, style, trainer_args, log_dir, *sbatch_options):
        """sbatch run_slurm.sh with `trainer_args` in a launch style (srun or torchrun)."""
        env = dict(self.env, LAUNCH=style, PYTHON=sys.executable)
        submitted = subprocess.run(
            ["sbatch", "--parsable", "--time=5", f"--output={log_dir}/%x-%j.out",
             f"--job-name=test-{style}", *sbatch_options, "run_slurm.sh", *trainer_args],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=30)
        assert submitted.returncode == 0, f"sbatch failed: {submitted.stderr}"
        job_id, _, _ = submitted.stdout.strip().partition(";")
        return Job(self, job_id, Path(log_dir) / f"test-{style}-{job_id}.out")


class Job:
    """A submitted job: its id and log, and once waited for, its state, exit code and run time."""

    def __init__(self, cluster, job_id, log):
        self.cluster = cluster
        self.id = job_id
        self.log = log
        self.submitted = time.monotonic()
        self.state = None
        self.exit_code = None
        self.seconds = None

    def wait(self, limit_s=JOB_LIMIT_S):
        """Poll the job's state (no accounting database here, so scontrol, not sacct) until it ends;
        `seconds` is then its run time, from start to end, as Slurm counts it."""
        while self.state is None:
            shown = self.cluster.slurm("scontrol", "show", "job", "-o", self.id).stdout
            fields = dict(re.findall(r"(\w+)=(\S+)", shown))
            if fields.get("JobState") in FINISHED:
                self.state = fields["JobState"]
                self.exit_code = fields["ExitCode"]
                days, _, clock = fields["RunTime"].rpartition("-")
                hours, minutes, seconds = map(int, clock.split(":"))
                self.seconds = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
            elif time.monotonic() - self.submitted > limit_s:
                self.cluster.slurm("scancel", self.id)
                pytest.fail(f"job {self.id} still {fields.get('JobState')} after {limit_s} s; "
                            f"log:\n{self.text()}")
            else:
                time.sleep(0.5)
        return self

    def text(self):
        """The job's log, as far as written."""
        return self.log.read_text() if self.log.exists() else "(no log)"


@pytest.fixture(scope="module")
def cluster():
    """A local two-node cluster for this module's tests, stopped and checked gone after them."""
    if os.geteuid() != 0:
        cannot_set_up("starting a Slurm cluster needs root (apt-get, slurmctld, slurmd, munged)")
    if not shutil.which("slurmctld") and not shutil.which("apt-get"):
        cannot_set_up("Slurm is not installed and there is no apt-get to install it")
    # munged runs as user munge and must reach its folder: pytest's tmp_path is 0700, so not there.
    directory = tempfile.mkdtemp(prefix="ddp-slurm-test-", dir="/tmp")
    os.chmod(directory, 0o755)
    local = Cluster(directory, free_port_triple())
    started = local.script("start_local_cluster.sh")
    if started.returncode != 0:
        local.script("stop_local_cluster.sh")
        shutil.rmtree(directory, ignore_errors=True)
        if not shutil.which("slurmctld"):
            cannot_set_up(f"Slurm could not be installed: {started.stderr.strip()}")
        pytest.fail(f"start_local_cluster.sh failed:\n{started.stdout}{started.stderr}")
    yield local
    stopped = local.script("stop_local_cluster.sh")
    left = daemons_of(directory)
    shutil.rmtree(directory, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr
    assert not left, f"daemons left running: {left}"


@pytest.fixture(scope="module")
def runs(cluster, tmp_path_factory):
    """Four jobs at once (each launch style, succeeding and failing) and, meanwhile, the local
    4-process run. A failing job has one rank per node: its rank 1 still dies on the other node
    than rank 0, and two ranks fewer start an interpreter each."""
    work = tmp_path_factory.mktemp("slurm-runs")
    # Small IDX files written here, ready before any rank starts (no network, no data from
    # outside the repository).
    write_dataset(str(work / "data"), train=2048 + 256, test=512)
    common = SMALL_RUN + ["--data-dir", str(work / "data"), "--results-dir", str(work / "results")]
    jobs = {}
    for style in STYLES:
        saved = ["--save-model", str(work / f"{style}.pt")]
        jobs[style] = cluster.submit(style, common + ["--run-name", style] + saved, work)
        dies = ["--debug-exit-rank", "1", "--debug-exit-step", "2"]
        jobs[style, "failing"] = cluster.submit(
            style, common + ["--run-name", f"{style}-failing"] + dies, work,
            "--ntasks-per-node=1")
    local = run_cli(*common, "--world-size", "4", "--run-name", "local",
                    "--save-model", str(work / "local.pt"), timeout=JOB_LIMIT_S)
    for job in jobs.values():
        job.wait()
    assert local.returncode == 0, f"the local reference run failed:\n{local.stderr}"
    return work, jobs


def read_results(path):
    """A results file."""
    return json.loads(Path(path).read_text())


def test_starting_the_cluster_again_leaves_one_cluster_up(cluster):
    again = cluster.script("start_local_cluster.sh")
    assert again.returncode == 0, again.stderr
    assert "already running" in again.stdout
    commands = daemons_of(cluster.dir)
    assert sorted(command.split()[0].rsplit("/", 1)[-1] for command in commands) == \
        ["munged", "slurmctld", "slurmd", "slurmd"], commands


def test_both_nodes_are_idle(cluster):
    listing = cluster.slurm("sinfo", "--noheader", "--Node", "--format=%N %t").stdout.split("\n")
    assert sorted(set(line for line in listing if line)) == [f"{node} idle" for node in NODES]


@pytest.mark.parametrize("style", STYLES)
def test_job_on_two_nodes_of_two_ranks_completes_with_exit_code_0(runs, style):
    job = runs[1][style]
    assert (job.state, job.exit_code) == ("COMPLETED", "0:0"), job.text()


@pytest.mark.parametrize("style", STYLES)
def test_results_show_four_ranks_on_two_hosts(runs, style):
    environment = read_results(runs[0] / "results" / f"{style}.json")["environment"]
    assert environment["world_size"] == 4
    assert environment["hosts"] == NODES
    assert environment["launcher"] == {"srun": "slurm", "torchrun": "torchrun"}[style]


@pytest.mark.parametrize("style", STYLES)
def test_final_parameters_equal_those_of_a_local_four_process_run(runs, style):
    expected = torch.load(runs[0] / "local.pt", weights_only=True)
    got = torch.load(runs[0] / f"{style}.pt", weights_only=True)
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=1e-6), f"{name} differs"


@pytest.mark.parametrize("style", STYLES)
def test_job_whose_rank_dies_early_fails_quickly_and_says_so(runs, style):
    job = runs[1][style, "failing"]
    assert job.state == "FAILED", job.text()
    assert job.exit_code != "0:0"
    assert job.seconds < FAILURE_LIMIT_S, f"ran {job.seconds} s before failing"
    assert "run_slurm.sh: FAILED" in job.text()


def test_the_sweep_submitter_plans_ddp_and_every_strategy_at_every_shape(capsys):
    from slurm import submit_sweep

    assert submit_sweep.main(["--dry-run", "--nodes", "1,2", "--tasks-per-node", "1,2",
                              "--strategies", "flat,flat-ring", "--", "--epochs", "1"]) == 0
    commands = capsys.readouterr().out.splitlines()
    assert [re.search(r"--job-name=(\S+)", command).group(1) for command in commands] == \
        [f"slurm-mlp-{series}-n{nodes}x{tasks}" for nodes in (1, 2) for tasks in (1, 2)
         for series in ("ddp", "manual-flat", "manual-flat-ring")]
    assert all(command.endswith("--epochs 1") for command in commands)


def test_the_sweep_submitter_runs_every_shape_then_gathers_results_and_plots(cluster, tmp_path):
    write_dataset(str(tmp_path / "data"), train=2048 + 256, test=512)
    results = tmp_path / "results"
    # the submitter sets --mode and --sync; DDP alone (no strategy) at both shapes: which series
    # it plans is checked by the dry run above
    trainer_args = SMALL + ["--data-dir", str(tmp_path / "data")]
    done = subprocess.run([sys.executable, "-m", "slurm.submit_sweep", "--nodes", "1,2",
                           "--tasks-per-node", "1", "--strategies", "",
                           "--results-dir", str(results), "--limit", str(JOB_LIMIT_S), "--",
                           *trainer_args], cwd=REPO, env=dict(cluster.env, PYTHON=sys.executable),
                          capture_output=True, text=True, timeout=JOB_LIMIT_S + 60)
    assert done.returncode == 0, done.stdout + done.stderr
    names = sorted(path.stem for path in results.glob("*.json"))
    assert names == ["slurm-mlp-ddp-n1x1", "slurm-mlp-ddp-n2x1"]
    two_nodes = read_results(results / "slurm-mlp-ddp-n2x1.json")
    assert two_nodes["environment"]["hosts"] == NODES
    plots = results / "plots"
    assert (plots / "scaling-mlp.png").exists() or (plots / "curves-mlp.png").exists()


def test_stopping_the_cluster_leaves_no_daemon_behind(cluster):
    """Last in the file: the other tests need the cluster up."""
    assert daemons_of(cluster.dir)
    for _ in range(2):  # and stopping twice is harmless
        stopped = cluster.script("stop_local_cluster.sh", timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        assert daemons_of(cluster.dir) == []
