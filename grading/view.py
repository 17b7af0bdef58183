"""What a process of student code can see, where Linux allows: namespaces made for each launch.

As root, every launch of student code (a command, or the ranks of a function) gets a network with
only loopback, IPC objects and a PID namespace of its own, shared by its ranks (`Namespaces`, held
by a process that does nothing, so the judge can read the network's counters from outside), and
each process a file system of its own (`enter`): a new root holding only the interpreter and its
libraries, the system's read-only folders, the sandbox and the data (read-only), the folders the
grader handed to this test's user, and a private /tmp and /dev/shm. Nothing of the instructor's
checkout, the judge's state or another test's files is in it. Where the system refuses, grade.py
says why and relies on the users (grading/sandbox.py).
"""
import ctypes
import fcntl
import os
import resource
import signal
import socket
import struct
import sys
from typing import NamedTuple

CLONE_NEWNS, CLONE_NEWIPC = 0x20000, 0x8000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
LIBC = ctypes.CDLL(None, use_errno=True)
# The system's folders a Python process needs, read-only; /bin, /lib and the like are links into
# /usr on a merged system, and made so in the view.
SYSTEM = ("/usr", "/etc", "/sys", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
DEVICES = ("null", "zero", "full", "random", "urandom")
# Signals a stand-in passes on to the process it stands for (a SIGKILL kills the stand-in alone;
# the grader kills the user's processes after each launch).
PASSED_ON = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2)


class View(NamedTuple):
    """What one process of student code sees: the namespaces it joins ((kind, pid of a holder's
    process in it), ...), the folders it sees read-only and writable (each at its own path), the
    folder that is its /dev/shm, and where its new root is mounted (an empty folder of root's).
    Its /tmp is a new, empty one."""
    namespaces: tuple
    read_only: tuple
    writable: tuple
    shm: str
    mount_point: str


def call(function, *arguments):
    """A libc call that raises OSError, naming its arguments, where it fails."""
    if function(*arguments) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{function.__name__}{arguments}: {os.strerror(errno)}")


def mount(source, target, kind, flags, options=None):
    """mount(2), its strings given as str."""
    call(LIBC.mount, source and source.encode(), target.encode(), kind and kind.encode(), flags,
         options and options.encode())


def interpreter_folders(private, instructor=None):
    """The folders this Python runs from: its installation, its virtual environment, and every
    entry of its path that exists; none in, or holding, a folder of `private`, and none holding
    the `instructor`'s folder (a virtual environment may be in it)."""
    folders = {os.path.realpath(sys.base_prefix), sys.prefix, os.path.realpath(sys.prefix),
               os.path.dirname(os.path.realpath(sys.executable))}
    folders.update(os.path.realpath(entry) for entry in sys.path if entry and os.path.isdir(entry))
    return tuple(sorted(folder for folder in folders if not any(
        within(folder, secret) or within(secret, folder) for secret in private)
        and not (instructor and within(instructor, folder))))


def within(path, folder):
    """Whether `path` is `folder` or below it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


FLAGS = {"net": CLONE_NEWNET, "ipc": CLONE_NEWIPC, "pid": CLONE_NEWPID}


class Namespaces:
    """New namespaces of the given kinds ("net": only loopback, "ipc", "pid"), held by a child of
    the judge's (and, for "pid", by the namespace's first process below it, which reaps orphans)
    until close(); closing a PID namespace kills every process left in it. OSError where the
    system refuses."""

    def __init__(self, kinds):
        ready_read, ready_write = os.pipe()
        hold_read, self._hold = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # only os._exit leaves: the judge's code must not run on here
            try:
                low, high = sorted((hold_read, ready_write))
                for start, stop in ((0, low), (low + 1, high), (high + 1, 65536)):
                    os.closerange(start, stop)  # another holder's end among them, say
                call(LIBC.unshare, sum(FLAGS[kind] for kind in kinds))
                if "net" in kinds:
                    loopback_up()
                first = os.fork() if "pid" in kinds else None
                if first == 0:
                    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # orphans reaped by the kernel
                else:
                    os.write(ready_write, f"ok {first or os.getpid()}".encode())
                os.close(ready_write)
                os.read(hold_read, 1)  # until the judge closes its end, or dies
                if first:
                    os.waitpid(first, 0)
            except BaseException as error:
                os.write(ready_write, f"{type(error).__name__}: {error}".encode()[:4000])
            finally:
                os._exit(0)
        os.close(ready_write)
        os.close(hold_read)
        with os.fdopen(ready_read, "rb") as file:
            answer = file.read().decode()
        if not answer.startswith("ok "):
            self.close()
            raise OSError(f"no namespaces for a launch: {answer or 'the holder died'}")
        self.member = int(answer.split()[1])  # a process in every namespace made
        self.joined = tuple((kind, self.member) for kind in kinds)

    def bytes_sent(self):
        """The bytes sent over the namespace's loopback (TCP and UDP payloads with their headers,
        whatever call sent them), by the kernel's count, read from outside."""
        with open(f"/proc/{self.pid}/net/dev") as file:
            for line in file:
                name, _, counters = line.partition(":")
                if name.strip() == "lo":
                    return int(counters.split()[8])
        raise OSError("the launch's network has no loopback")

    def close(self):
        """Let the holder go: the namespaces end with their last process."""
        if self._hold is not None:
            os.close(self._hold)
            self._hold = None
            os.waitpid(self.pid, 0)


def loopback_up():
    """Bring this network namespace's loopback up (SIOCSIFFLAGS: IFF_UP | IFF_LOOPBACK |
    IFF_RUNNING), without a program to run."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        fcntl.ioctl(probe, 0x8914, struct.pack("16sH14x", b"lo", 0x1 | 0x8 | 0x40))


def enter(view):
    """As root, in the process about to become (or run) student code: join the view's
    namespaces, then go on in a child, in a file system that holds only what `view` names.
    Returns in that child; the caller's process stays behind as its stand-in, and ends as it
    ends."""
    for kind, pid in view.namespaces:
        descriptor = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
        try:
            call(LIBC.setns, descriptor, FLAGS[kind])
        finally:
            os.close(descriptor)
    call(LIBC.unshare, CLONE_NEWNS)
    stand_in_for_a_child()  # a new PID namespace takes in children only
    make_root(view)


def stand_in_for_a_child():
    """Fork. The parent stays behind as the child's stand-in: it passes signals on, waits, and
    ends as the child ended; it never returns. The child returns."""
    child = os.fork()
    if child == 0:
        return
    try:
        for number in PASSED_ON:
            signal.signal(number, lambda number, _: os.kill(child, number))
        os.closerange(3, 65536)  # nothing of the launch's held open by a stand-in
        end_as(wait_for(child))
    finally:
        os._exit(1)


def wait_for(child):
    """`child`'s wait status."""
    while True:
        try:
            return os.waitpid(child, 0)[1]
        except InterruptedError:
            continue


def end_as(status):
    """End this process as a child with wait status `status` ended: its exit code, or killed by
    its signal (no core written)."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [number])
        os.kill(os.getpid(), number)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def make_root(view):
    """Mount the view's folders on a fresh root, move into it and let the old one go. Every
    mount point is made in a folder of root's made here, or read-only: none in a folder student
    code could have written (a link there would take a mount elsewhere)."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the judge's view
    root = view.mount_point
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for name in SYSTEM:
        if os.path.islink(name):
            os.symlink(os.readlink(name), root + name)
    os.mkdir(root + "/tmp")
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    folders = [(name, False) for name in SYSTEM if os.path.isdir(name) and not os.path.islink(name)]
    folders += [(folder, False) for folder in view.read_only] + [(f, True) for f in view.writable]
    writable = []
    for source, is_writable in sorted(set(folders), key=lambda pair: (pair[0].count("/"), pair)):
        if not any(within(source, folder) for folder in writable):  # else seen through it
            bind(source, root + source, is_writable)
        if is_writable:
            writable.append(source)
    for name in DEVICES:
        bind(f"/dev/{name}", f"{root}/dev/{name}", True)
    bind(view.shm, root + "/dev/shm", True)
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(root)
    call(LIBC.syscall, SYS_PIVOT_ROOT[os.uname().machine], b".", b".")
    call(LIBC.umount2, b".", MNT_DETACH)  # the old root, stacked under the new one
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def bind(source, target, writable):
    """Mount `source` at `target` (made, a folder or a file as the source is), read-only unless
    `writable`."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(source, target, None, MS_BIND | MS_REC)
    if not writable:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def refused(view, uid):
    """Why a process cannot enter `view` as `uid` and run Python there, tried in a forked child;
    None where it can."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # only os._exit leaves: the parent's code must not run on here
        try:
            os.close(read)
            enter(view)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.execv(sys.executable, [sys.executable, "-c", "import os; os.listdir('/tmp')"])
        except BaseException as error:
            os.write(write, f"{type(error).__name__}: {error}".encode()[:4000] or b"?")
        finally:
            os._exit(1)
    os.close(write)
    with os.fdopen(read, "rb") as file:
        why = file.read().decode()
    _, status = os.waitpid(pid, 0)
    if not why and os.waitstatus_to_exitcode(status) != 0:
        why = f"Python could not run in the view (exit status {os.waitstatus_to_exitcode(status)})"
    return why or None
