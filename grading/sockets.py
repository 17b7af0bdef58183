"""No new sockets: a seccomp filter for the ranks whose bytes the integrity checks count.

Installed after the ranks' process group is made and before any student code is imported, it
makes socket() and socketpair() fail with EPERM: those not on the internet's families where the
launch has a network of its own (grading/view.py counts what crosses it, and a Unix socket between
ranks would not cross it), every one where it has none (nothing would count it). The filter holds
for the process and all it starts, and cannot be lifted.
"""
import ctypes
import errno
import os
import socket
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
LOAD_WORD, JUMP_IF_EQUAL, JUMP_IF_AT_LEAST, RETURN = 0x20, 0x15, 0x35, 0x06
ALLOW, REFUSE = 0x7FFF0000, 0x00050000 | errno.EPERM  # SECCOMP_RET_ERRNO
# (audit architecture, socket, socketpair) by machine; x86-64's x32 calls are refused whole
ARCHITECTURES = {"x86_64": (0xC000003E, 41, 53), "aarch64": (0xC00000B7, 198, 199)}
X32_CALLS = 0x40000000
INTERNET = (socket.AF_INET, socket.AF_INET6)


def instruction(code, value, if_true=0, if_false=0):
    """One classic BPF instruction: struct sock_filter."""
    return struct.pack("HBBI", code, if_true, if_false, value)


def program(machine, internet_allowed):
    """The filter, as bytes: seccomp_data holds nr at 0, arch at 4 and args[0] at 16."""
    architecture, socket_call, pair_call = ARCHITECTURES[machine]
    families = INTERNET if internet_allowed else ()
    checks = [instruction(JUMP_IF_EQUAL, family, len(families) - index, 0)
              for index, family in enumerate(families)]
    return b"".join([
        instruction(LOAD_WORD, 4),
        instruction(JUMP_IF_EQUAL, architecture, 1, 0),
        instruction(RETURN, REFUSE),  # another architecture's calls: none expected
        instruction(LOAD_WORD, 0),
        instruction(JUMP_IF_AT_LEAST, X32_CALLS, 0, 1),
        instruction(RETURN, REFUSE),
        instruction(JUMP_IF_EQUAL, pair_call, len(checks) + 3, 0),
        instruction(JUMP_IF_EQUAL, socket_call, 1, 0),
        instruction(RETURN, ALLOW),
        instruction(LOAD_WORD, 16),
        *checks,
        instruction(RETURN, REFUSE),
        instruction(RETURN, ALLOW),
    ])


def forbid_new_sockets(internet_allowed):
    """From now on, in this process and what it starts: no socketpair(), and socket() only for the
    internet's families where `internet_allowed`. OSError where the system cannot filter."""
    machine = os.uname().machine
    if machine not in ARCHITECTURES:
        raise OSError(f"no socket filter for {machine}")
    code = program(machine, internet_allowed)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxP", len(code) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    for arguments in ((PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
                      (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0)):
        if libc.prctl(*arguments) != 0:
            raise OSError(ctypes.get_errno(), f"prctl{arguments[:2]}: seccomp refused")
