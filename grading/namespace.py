"""Each child's own view of the files (a Linux mount namespace), made as root before it becomes
student code: every mount read-only but the scratch folder and the shared temporary folders, the
sandbox read-only by its mount too, and every other folder of the grading (the judge's code, its
report and log) an empty one. Where the system refuses, grade.py says why and relies on the uids.
"""
import ctypes
import os
import re

CLONE_NEWNS = 0x20000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
# A remount sets every flag of the mount: those it had are kept, or root would clear them.
KEPT = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1024,
        "nodiratime": 2048, "relatime": 1 << 21}
LIBC = ctypes.CDLL(None, use_errno=True)


def call(function, *arguments):
    """A libc call that raises OSError, naming its arguments, where it fails."""
    if function(*arguments) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{function.__name__}{arguments}: {os.strerror(errno)}")


def mount(source, target, kind, flags, options=None):
    """mount(2), its strings given as str."""
    call(LIBC.mount, source and source.encode(), target.encode(), kind and kind.encode(), flags,
         options and options.encode())


def mounts():
    """(mount point, the flags to keep) of each mount of this namespace."""
    with open("/proc/self/mountinfo") as file:
        fields = [line.split() for line in file]
    return [(re.sub(r"\\([0-7]{3})", lambda code: chr(int(code[1], 8)), point),  # "\040": " "
             sum(KEPT.get(option, 0) for option in options.split(",")))
            for _, _, _, _, point, options, *_ in fields]


def within(path, folder):
    """Whether `path` is `folder` or below it."""
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def private_view(sandbox, scratch, shared):
    """Move this process into a mount namespace of its own where only `scratch` and the `shared`
    folders can be written, `sandbox` is read-only, and every other folder beside `scratch` (the
    grading's) is an empty read-only one. OSError where the system refuses."""
    call(LIBC.unshare, CLONE_NEWNS)
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the judge's view
    writable = [scratch] + [folder for folder in shared if os.path.isdir(folder)]
    for folder in writable + [sandbox]:  # each a mount of its own, whatever it is part of
        mount(folder, folder, None, MS_BIND | MS_REC)
    for point, flags in mounts():
        if within(point, sandbox) or not any(within(point, folder) for folder in writable):
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
    work = os.path.dirname(scratch)
    for name in os.listdir(work):
        path = os.path.join(work, name)
        if path not in (sandbox, scratch) and os.path.isdir(path):
            mount("none", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "size=4k,mode=0555")
    os.chdir(os.getcwd())  # the working folder as this view shows it


def refused(sandbox, scratch, shared):
    """Why a child cannot have private_view(), tried in a forked process; None where it can."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # only os._exit leaves: the parent's code must not run on here
        try:
            os.close(read)
            private_view(sandbox, scratch, shared)
            os.write(write, b"")
        except BaseException as error:
            os.write(write, f"{type(error).__name__}: {error}".encode()[:4000] or b"?")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as file:
        why = file.read().decode()
    os.waitpid(pid, 0)
    return why or None
