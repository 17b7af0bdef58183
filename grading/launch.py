"""The one way tests start student code: the command line (and any `python SCRIPT` or `python -m
MODULE`) as a process of its own, and a function run in N real processes joined by a gloo process
group; each forked from one server that has imported torch, and a child of the sandbox
(grading/sandbox.py)."""
import contextlib
import functools
import os
import runpy
import subprocess
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import multiprocessing
from torch.multiprocessing.spawn import ProcessException

from grading import sandbox, sockets, view
from grading.leftovers import descendants_of, kill_with_descendants
from grading.sandbox import SANDBOX


def run_cli(*args, timeout=180, env=None, fresh_interpreter=False):
    """`python mlp_ddp.py ARGS` in SANDBOX (the code under test), without the caller's
    OFFLINE_DATA_DIR (run_python). `fresh_interpreter`: a new `python`, for a test that needs
    what differs between interpreters (the hash seed)."""
    environment = without_offline_data()
    environment.update(env or {})
    arguments = [os.path.join(SANDBOX, "mlp_ddp.py"), *map(str, args)]
    if fresh_interpreter:
        return sandbox.run_interpreter(arguments, timeout=timeout, env=environment)
    return run_python(arguments, timeout=timeout, env=environment)


def run_python(arguments, timeout=None, env=None):
    """sandbox.run_interpreter(ARGUMENTS), `python SCRIPT ARGS` or `python -m MODULE ARGS` as a
    process of student code, but forked from the server that has imported torch (START_METHOD),
    as the test functions' ranks are: a fresh interpreter spends 1.5 s of CPU importing torch, 3 s
    with the torch._dynamo that the first optimizer imports, most of a small run's cost."""
    environment = dict(os.environ if env is None else env)
    command = [sys.executable, *map(str, arguments)]
    limited = sandbox.seconds_left(timeout)
    with sandbox.fresh_folder() as folder:  # where the script's output goes
        process = multiprocessing.get_context(START_METHOD).Process(
            target=_run_script, args=(folder, sandbox.identity(), environment, command[1:]))
        process.start()
        process.join(limited)
        ended = process.exitcode is not None
        if not ended:
            kill_with_descendants(process.pid)
            process.join()
        sandbox.settle()  # before reading: a link left in place of an output file is gone
        if not ended:
            if limited != timeout:
                raise sandbox.timed_out()
            raise subprocess.TimeoutExpired(command, timeout)
        output = [read_bounded(os.path.join(folder, name)) for name in ("stdout", "stderr")]
    return subprocess.CompletedProcess(command, process.exitcode, *output)


def _run_script(folder, child, environment, arguments):
    # As a fresh `python ARGUMENTS` would run: its output into files the judge opened (as the
    # judge, before the change of user), the environment given, the sandbox as its folder, and
    # first on the path the script's folder, or for -m the current one.
    output_into(os.path.join(folder, "stdout"), 1)
    output_into(os.path.join(folder, "stderr"), 2)
    os.environ.clear()
    os.environ.update(environment)
    sandbox.enter(child)
    os.chdir(SANDBOX)
    if arguments[0] == "-m":
        sys.path.insert(0, SANDBOX)
        sys.argv = arguments[1:]  # run_module puts the module's path in place of its name
        runpy.run_module(arguments[1], run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(arguments[0])))
        sys.argv = arguments
        runpy.run_path(arguments[0], run_name="__main__")


def output_into(path, *descriptors):
    """The `descriptors` (1: stdout, 2: stderr) written to a new file `path`, opened before the
    change of user, so the judge's own."""
    output = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    for descriptor in descriptors:
        os.dup2(output, descriptor)
    os.close(output)


def read_bounded(path):
    """A file's text, cut to sandbox.OUTPUT_LIMIT; "" if there is none."""
    try:
        with open(path, "rb") as file:
            return sandbox.bounded(file)
    except OSError:
        return ""


def run_ok(*args, **kwargs):
    """run_cli, which must succeed."""
    done = run_cli(*args, **kwargs)
    assert done.returncode == 0, done.stderr
    return done


def without_offline_data():
    """This process's environment without OFFLINE_DATA_DIR: the tests choose their data."""
    return {name: value for name, value in os.environ.items() if name != "OFFLINE_DATA_DIR"}


# Ranks are forked from one server that imported torch once (a second of CPU per rank saved); it
# runs no tensor operation, so forking it is safe, and preloads nothing of the project. torch's
# optimizers import torch._dynamo at the first one built: without it preloaded the parity tests
# took 2.6 times as long.
START_METHOD = "forkserver"
PRELOADED = ["torch", "torch.distributed", "torch._dynamo"]
multiprocessing.get_context(START_METHOD).set_forkserver_preload(PRELOADED)


class LaunchFailed(Exception):
    """A launch shared by several tests failed in an earlier one."""


def launch_once(function):
    """Cache `function`'s result by its arguments, and its failure: a later test fails at once,
    naming it, instead of starting the processes again for every parametrised case."""
    done = {}

    @functools.wraps(function)
    def once(*args):
        if args in done:
            succeeded, value = done[args]
            if not succeeded:
                # the last line of a rank's traceback says what went wrong
                last_line = (str(value).strip().splitlines() or [type(value).__name__])[-1]
                raise LaunchFailed(f"{function.__name__}{args} failed in an earlier test: "
                                   f"{last_line}")
            return value
        try:
            value = function(*args)
        except Exception as error:
            done[args] = (False, error)
            raise
        done[args] = (True, value)
        return value

    return once


class ChildFailed(Exception):
    """The code under test raised, or died, in a child process: the child's own traceback."""


# How long a collective of the tests may wait: every launch's ranks do small, equal work, so a
# longer wait is a deadlock, which then fails within seconds; stretched where grade.py's
# calibration found the machine slower.
COLLECTIVE_TIMEOUT_S = 15 * float(os.environ.get("GRADE_STRETCH", 1))


def run_in_processes(world_size, function, *args, timeout_s=COLLECTIVE_TIMEOUT_S,
                     recorded=False):
    """`function(rank, world_size, *args)` on every rank, each a child process with the code under
    test, joined by gloo (`recorded`: grading/recorded_group.py); the results in rank order, as
    data: torch.load(weights_only=True) runs no code of the child's."""
    __tracebackhide__ = True  # a failure shows the child's traceback, not the launcher's
    backend = "recorded" if recorded else "gloo"
    return _launch(world_size, function, args, timeout_s, backend)


def run_counting_bytes(world_size, function, *args, timeout_s=COLLECTIVE_TIMEOUT_S,
                       recorded=False):
    """run_in_processes, with what the ranks sent: (results, bytes, how they were counted). Where
    Linux allows, the ranks share a network of their own and nothing else (IPC objects, files,
    processes), and the kernel counts what crosses it, read from outside ("network"); elsewhere,
    what each rank's process wrote, less its result ("writes": /proc/PID/io's wchar, which send()
    and the like escape). Either way a rank can make no socket once its process group is made
    (grading/sockets.py): none at all where nothing would count it."""
    __tracebackhide__ = True
    backend = "recorded" if recorded else "gloo"
    with counted_network() as network:
        counting = "network" if network else "writes"
        results, written = _launch(world_size, function, args, timeout_s, backend, counting,
                                   network)
        return results, network.bytes_sent() if network else sum(written), counting


@contextlib.contextmanager
def counted_network():
    """A network of its own for a launch whose bytes are counted, or None where grade.py chose the
    fallback or the system refuses (then the bytes written are counted)."""
    network = None
    if sandbox.NAMESPACES != "0":
        try:
            network = view.Namespaces(("net",))
        except OSError:
            if sandbox.NAMESPACES == "1":  # grade.py found them possible: a failure is the grader's
                raise
    try:
        yield network
    finally:
        if network is not None:
            network.close()


def run_alone(function, *args):
    """`function(*args)` in one child process with the code under test (no process group)."""
    __tracebackhide__ = True
    return _launch(1, function, args, None, backend=None)[0]


def _launch(world_size, function, args, timeout_s, backend, counting=None, network=None):
    """The ranks' results; where their bytes are `counting` ("network": over `network`, each rank
    with nothing else of the others'; "writes"), also the bytes each rank wrote (for "writes")."""
    __tracebackhide__ = True
    # here, not at the top: a child imports this module, and must import no module of the
    # submission's before its process group is made (grading/recorded_group.py)
    from runtime.launch import free_port

    target = (function.__module__, function.__qualname__)
    if timeout_s is not None:  # the process group's own timeout ends within the test's time
        timeout_s = max(1.0, sandbox.seconds_left(timeout_s))
    with sandbox.fresh_folder() as folder:  # each rank writes its result in its own folder below
        ranks = [sandbox.new_folder(os.path.join(folder, str(rank))) for rank in range(world_size)]
        children = ([sandbox.isolated(network, rank_folder,
                                      sandbox.new_folder(os.path.join(folder, f"shm-{rank}")))
                     for rank, rank_folder in enumerate(ranks)]
                    if counting == "network" else [sandbox.identity()] * world_size)
        worker_args = (world_size, free_port(), folder, children, target, args, timeout_s,
                       backend, counting)
        context = multiprocessing.start_processes(_worker, args=worker_args, nprocs=world_size,
                                                  join=False, start_method=START_METHOD)
        failure = None
        try:
            written = wait_for(context, ranks, counting == "writes")
        except ProcessException as error:
            failure = ChildFailed(str(error).strip())
        except sandbox.TestTimedOut as error:
            failure = error
        finally:
            for process in context.processes:  # past the deadline, or beside a rank that failed
                if process.is_alive():
                    kill_with_descendants(process.pid)
            sandbox.settle()
            print_what_they_printed(ranks)
        if failure:  # read after settle(), as the output: what is there is the ranks' own
            raise type(failure)(f"{failure}{verdict(ranks)}") from None
        results = [torch.load(os.path.join(rank_folder, "result.pt"), weights_only=True)
                   for rank_folder in ranks]
        return (results, written) if counting else results


def wait_for(context, ranks, count_writes):
    """Until every rank has ended, or the test's time has run out (sandbox.TestTimedOut). With
    `count_writes`: each time all of them wait at their end (RANK/done), read the bytes each wrote,
    then let them go; returns each rank's count at the last such reading, less its result and
    output files, which must not have changed since."""
    waiting = [os.path.join(rank_folder, "done") for rank_folder in ranks]
    counted = None
    while not context.join(timeout=0.01):
        if sandbox.seconds_left() == 0:
            raise sandbox.timed_out()
        if count_writes and all(os.path.lexists(path) for path in waiting):
            counted = [(bytes_written(process.pid), own_files(rank_folder))
                       for rank_folder, process in zip(ranks, context.processes)]
            for path in waiting:
                os.unlink(path)
    if not count_writes:
        return None
    if counted is None:
        raise ChildFailed("the ranks ended without waiting to have their writes counted")
    for rank, (rank_folder, (_, files)) in enumerate(zip(ranks, counted)):
        if own_files(rank_folder) != files:
            raise ChildFailed(f"rank {rank} wrote its result after its writes were counted")
    return [written - sum(size for size, _ in files) for written, files in counted]


def verdict(ranks):
    """Where the ranks' collectives parted ways (runtime/hang_verdict.py), as lines to add to a
    failure; "" where they agree."""
    from runtime import hang_verdict
    records = {}
    for rank_folder in ranks:
        records.update(hang_verdict.read_records(rank_folder))
    found = hang_verdict.compare(records)
    return f"\nthe ranks' collectives: {found}" if found else ""


def bytes_written(pid):
    """What the process `pid` and its live descendants wrote, by the kernel's count."""
    total = 0
    for process in [pid, *descendants_of(pid)]:
        try:
            with open(f"/proc/{process}/io") as file:
                fields = dict(line.split(": ") for line in file.read().splitlines())
        except OSError:
            continue  # ended meanwhile: its bytes are its parent's now
        total += int(fields["wchar"])
    return total


def own_files(rank_folder):
    """(size, modification time) of the rank's result and output files."""
    found = []
    for name in ("result.pt", "output.txt"):
        try:
            status = os.lstat(os.path.join(rank_folder, name))
            found.append((status.st_size, status.st_mtime_ns))
        except FileNotFoundError:
            found.append((0, None))
    return found


def print_what_they_printed(ranks):
    """What each rank printed, cut to sandbox.OUTPUT_LIMIT, into this test's captured output (read
    after sandbox.settle(): a link left in its place is gone)."""
    for rank, rank_folder in enumerate(ranks):
        try:
            with open(os.path.join(rank_folder, "output.txt"), "rb") as file:
                text = sandbox.bounded(file)
        except OSError:  # none, or not a file the rank wrote
            continue
        if text:
            print(f"--- rank {rank} printed:\n{text.rstrip()}")


def _worker(rank, world_size, port, folder, children, target, args, timeout_s, backend, counting):
    rank_folder = os.path.join(folder, str(rank))
    # What the rank prints goes to a file the judge reads back cut (print_what_they_printed), never
    # into the judge's own output
    output_into(os.path.join(rank_folder, "output.txt"), 1, 2)
    module, name = target
    hidden = sandbox.hidden_code(module)  # read while the judge's folder is still there
    sandbox.enter(children[rank])  # the child user, its view: before any code under test runs
    torch.set_num_threads(1)  # up to 5 ranks share 2 cores
    if backend == "recorded":  # before any student code: grading/recorded_group.py
        from grading import recorded_group
        backend = recorded_group.register()
    if backend:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=timeout_s))
    if counting:  # before any code under test: no channel but the counted one
        sockets.forbid_new_sockets(internet_allowed=counting == "network")
    function = functools.reduce(getattr, name.split("."), sandbox.import_under_test(module, hidden))
    if backend:
        record_collectives(rank_folder, rank)
    try:
        result = function(rank, world_size, *args) if backend else function(*args)
    finally:
        if backend:
            destroy_process_group()
    torch.save(result, os.path.join(rank_folder, "result.pt"))
    sys.stdout.flush()
    sys.stderr.flush()
    if counting == "writes":  # wait while the judge counts what this process wrote (wait_for)
        done = os.path.join(rank_folder, "done")
        open(done, "w").close()
        while os.path.exists(done):
            time.sleep(0.005)
    # Skip interpreter teardown, as mlp_ddp.py does: gloo's threads can abort the process there
    # (SIGABRT, pytorch/pytorch#179291), which the parent would report as this rank failing.
    os._exit(0)


KEPT_ALIVE = []  # process groups never destroyed: see destroy_process_group


def destroy_process_group():
    """As runtime/torch_compat.py's (the judge runs none of the submission's code): torch 2.6's
    group destructor joins gloo's threads holding the GIL, and a thread finishing a Python
    callback waits for it, so there the group stays referenced until the rank exits."""
    if not hasattr(dist.ProcessGroup, "shutdown"):
        KEPT_ALIVE.append(dist.group.WORLD)
    dist.destroy_process_group()


def record_collectives(folder, rank):
    """Each rank's collectives into its record in `folder`, for verdict(): the runtime's recorder,
    where the code under test has it, over every operation (a test calls the library itself)."""
    try:
        from runtime import collective_record
    except ImportError:
        return
    collective_record.install(folder, rank, operations=collective_record.OPERATIONS)
