"""What student code leaves behind, found and removed by the judge: the processes of a user (and
below a process), what a user left in the folders anyone may write, and its System V IPC objects."""
import contextlib
import ctypes
import os
import shutil
import signal
import time

KILL_WITHIN_S = 10
# Where any user may write: what a test's user left there is removed with the test.
SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")


def process_table():
    """{pid: (parent, {real and effective uid}, state)} of every process in /proc."""
    table = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else []:
        try:
            with open(f"/proc/{name}/status") as file:
                fields = dict(line.split(":", 1) for line in file if ":" in line)
            table[int(name)] = (int(fields["PPid"]), set(map(int, fields["Uid"].split()[:2])),
                                fields["State"].strip()[:1])
        except (OSError, ValueError, KeyError):
            continue  # not a process, or gone meanwhile
    return table


def processes_of(uids):
    """The live (not zombie) processes whose real or effective uid is in `uids`."""
    return [pid for pid, (_, owners, state) in process_table().items()
            if state not in "ZX" and owners & uids]


def kill_processes_of(*uids):
    """SIGKILL every process of these uids until none is left."""
    kill_until_gone(lambda: processes_of(set(uids)))


def kill_until_gone(find, reap=False):
    """SIGKILL the processes find() names until it names none (they may be forking meanwhile);
    `reap`: also reap them, where they are this process's children."""
    deadline = time.monotonic() + KILL_WITHIN_S
    while (pids := find()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError, ChildProcessError):
                os.kill(pid, signal.SIGKILL)
                if reap:
                    os.waitpid(pid, os.WNOHANG)
        time.sleep(0.01)


def remove_files_of(*uids):
    """Remove what these users left in the SHARED_FOLDERS."""
    for folder in SHARED_FOLDERS:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid not in uids:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)  # by descriptors: follows no link
                else:
                    os.unlink(entry.path)


IPC_KINDS = (("shm", "shmctl"), ("msg", "msgctl"), ("sem", "semctl"))


def ipc_objects_of(*uids):
    """[(kind, id), ...] of the System V IPC objects (shared memory, message queues, semaphores)
    these users own or made, in the judge's IPC namespace."""
    found = []
    for kind, _ in IPC_KINDS:
        try:
            with open(f"/proc/sysvipc/{kind}") as file:
                header, *rows = [line.split() for line in file]
        except OSError:
            continue
        column = {name: index for index, name in enumerate(header)}
        found += [(kind, int(row[1])) for row in rows
                  if {int(row[column["uid"]]), int(row[column["cuid"]])} & set(uids)]
    return found


def remove_ipc_objects_of(*uids):
    """Remove the System V IPC objects these users own or made: without IPC namespaces, one test's
    child could leave one for a later test's."""
    libc = ctypes.CDLL(None, use_errno=True)
    controls = dict(IPC_KINDS)
    for kind, identifier in ipc_objects_of(*uids):
        getattr(libc, controls[kind])(identifier, 0, 0)  # IPC_RMID


def kill_with_descendants(pid):
    """SIGKILL a process and every process below it, found first."""
    for process in [*descendants_of(pid), pid]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(process, signal.SIGKILL)


def descendants_of(root):
    """Every descendant of `root`, zombies included."""
    children = {}
    for pid, (parent, _, _) in process_table().items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], [root]
    while stack:
        below = children.get(stack.pop(), [])
        found += below
        stack += below
    return found
