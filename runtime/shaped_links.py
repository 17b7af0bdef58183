"""An emulated network on one machine: each host (a local rank, or a slurmd node) in its own network
namespace, joined to a Linux bridge by a veth pair whose two ends are both shaped by `tc tbf`.

This file makes it, puts a rank into it and removes it; runtime/emulated_network.py holds the
options and the command line that ask for one.

One host's processes talk over its namespace's loopback (unshaped, like the fast links inside a
node); hosts talk over their shaped links. Every host's interface has the same name, INTERFACE,
so one GLOO_SOCKET_IFNAME fits all. Needs root, `ip` and `tc`; the kernel here has no netem, so
bandwidth is shaped but no delay is added.

Every name starts with PREFIX; a local run's tag holds its pid, so two runs never collide and a
run killed by SIGKILL is found by `clean_up`. Each object is written to the record file before it
is made, so `tear_down` removes everything, also after a start that failed midway. Standard
library only: slurm/start_local_cluster.sh runs it, through runtime/emulated_network.py, with the
system's python3.
"""
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess

PREFIX = "ddpn"  # every namespace, veth and bridge made here starts with it
INTERFACE = "ddplink0"  # each host's shaped interface, the same name in every namespace
DEFAULT_SUBNET = "10.213.0"  # hosts are SUBNET.1, SUBNET.2, ...; the bridge (if given one) .254
BRIDGE_HOST = 254
CLONE_NEWNET = 0x40000000
# tc's rate units (tc-rate(8)): bit-based and byte-based ("bps" is bytes per second), SI or IEC.
RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
              "kibit": 2**10, "mibit": 2**20, "gibit": 2**30, "tibit": 2**40,
              "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12,
              "kibps": 8 * 2**10, "mibps": 8 * 2**20, "gibps": 8 * 2**30, "tibps": 8 * 2**40}
FAIL_HOOK = "DDP_EMULATED_NETWORK_FAIL_AT"  # tests: fail before the Nth command of a start


class NetworkUnavailable(Exception):
    """The emulated network cannot be made here; the message is one line saying why."""


def parse_rate(text):
    """tc's rate syntax ('1gbit', '100mbit', '125mbps') -> bits per second; ValueError if not."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", text.strip().lower())
    if not match or match.group(2) not in RATE_UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"expected a tc rate such as 100mbit, 1gbit or 10gbit, got {text!r}")
    return int(float(match.group(1)) * RATE_UNITS[match.group(2)])


def check_usable():
    """Raise NetworkUnavailable, with the reason, unless this process can make namespaces."""
    if os.geteuid() != 0:
        raise NetworkUnavailable("--emulate-link needs root (it makes network namespaces, veth "
                                 "pairs and a bridge, and shapes them with tc)")
    missing = [tool for tool in ("ip", "tc") if not shutil.which(tool)]
    if missing:
        raise NetworkUnavailable(f"--emulate-link needs {' and '.join(missing)} (Debian: apt-get "
                                 "install iproute2)")


def burst_bytes(bits_per_s):
    """tbf's bucket: the bytes that may pass at once, above the rate."""
    # veth hands tbf GSO packets of up to 64 KiB: a burst below that makes tbf split each one
    # in software. 1 ms of line rate above that keeps the shaper's timer from limiting 10gbit.
    return max(128 * 1024, int(bits_per_s / 8 * 1e-3))


def tbf_arguments(bits_per_s):
    """tc tbf's parameters for a link of this rate."""
    # A queue of 50 ms of line rate: TCP fills it instead of losing packets to a short one.
    return ["rate", f"{bits_per_s}bit", "burst", str(burst_bytes(bits_per_s)), "latency", "50ms"]


class EmulatedNetwork:
    """`hosts` namespaces TAG-0.. on bridge TAGb, joined by veths TAGh0.. (bridge end) and
    INTERFACE (host end), both shaped to `rate`. As a context manager: up on entry, down on exit,
    with SIGINT/SIGTERM held meanwhile so that neither is left half done."""

    def __init__(self, tag, hosts, rate, subnet=DEFAULT_SUBNET, bridge_address=False,
                 record=None):
        self.tag = tag
        self.hosts = hosts
        self.rate = rate
        self.bits_per_s = parse_rate(rate)
        self.subnet = subnet
        self.bridge_address = bridge_address  # give the bridge SUBNET.254: root can reach hosts
        self.record = record or f"/run/{tag}.network"
        self.bridge = f"{tag}b"
        self.namespaces = [f"{tag}-{host}" for host in range(hosts)]
        self.bridge_ends = [f"{tag}h{host}" for host in range(hosts)]
        self.commands_run = 0

    def address(self, host):
        """Host `host`'s address on the emulated network."""
        return f"{self.subnet}.{host + 1}"

    def up(self):
        """Make the bridge, the namespaces and the shaped veths; on any failure remove what was
        made and raise NetworkUnavailable."""
        with open(self.record, "w"):  # a fresh record; each object is added before it is made
            pass
        try:
            self._note("link", self.bridge)
            self._ip("link", "add", self.bridge, "type", "bridge")
            if self.bridge_address:
                self._ip("addr", "add", f"{self.subnet}.{BRIDGE_HOST}/24", "dev", self.bridge)
            self._ip("link", "set", self.bridge, "up")
            for host, (namespace, end) in enumerate(zip(self.namespaces, self.bridge_ends)):
                self._note("netns", namespace)
                self._ip("netns", "add", namespace)
                self._note("link", end)
                self._ip("link", "add", end, "type", "veth", "peer", "name", INTERFACE,
                         "netns", namespace)
                self._ip("link", "set", end, "master", self.bridge, "up")
                inside = ["-n", namespace]
                self._ip(*inside, "addr", "add", f"{self.address(host)}/24", "dev", INTERFACE)
                self._ip(*inside, "link", "set", INTERFACE, "up")
                self._ip(*inside, "link", "set", "lo", "up")  # the host's own, unshaped traffic
                # Both directions: the bridge end's egress is the host's download, the host
                # end's egress its upload.
                self._tc("qdisc", "add", "dev", end, "root", "tbf", *tbf_arguments(self.bits_per_s))
                self._tc(*inside, "qdisc", "add", "dev", INTERFACE, "root", "tbf",
                         *tbf_arguments(self.bits_per_s))
        except NetworkUnavailable:
            self.down()
            raise
        return self

    def down(self):
        """Remove everything the record names (a veth's deletion takes its peer and both
        qdiscs with it); absent objects are fine. Returns the objects that could not be
        removed."""
        return tear_down(self.record)

    def enter(self, host):
        """Move the calling thread into host `host`'s namespace and point gloo at its interface;
        call before any socket or thread is made (new threads inherit the namespace)."""
        enter_namespace(self.namespaces[host])
        os.environ["GLOO_SOCKET_IFNAME"] = INTERFACE

    def __enter__(self):
        with held_signals():
            return self.up()

    def __exit__(self, *exc_info):
        with held_signals():
            self.down()

    def _note(self, kind, name):
        with open(self.record, "a") as file:
            file.write(f"{kind} {name}\n")

    def _ip(self, *arguments):
        self._run("ip", *arguments)

    def _tc(self, *arguments):
        self._run("tc", *arguments)

    def _run(self, *command):
        self.commands_run += 1
        if os.environ.get(FAIL_HOOK) == str(self.commands_run):
            raise NetworkUnavailable(f"failed on purpose at command {self.commands_run} "
                                     f"({FAIL_HOOK})")
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            message = (done.stderr.strip().splitlines() or ["(no message)"])[0]
            if "qdisc kind is unknown" in message:
                message = "this kernel has no tbf qdisc (sch_tbf), so links cannot be shaped"
            raise NetworkUnavailable(f"emulated network: '{' '.join(command)}' failed: {message}")


def tear_down(record):
    """Remove the links, then the namespaces, that a record file names; delete the record once
    all are gone. Returns what could not be removed."""
    try:
        with open(record) as file:
            entries = [line.split() for line in file if line.strip()]
    except FileNotFoundError:
        return []
    left = []
    # links first: a namespace's veth would otherwise live on while a process holds it
    for kind, name in sorted(entries, key=lambda entry: entry[0] != "link"):
        command = ["ip", "link", "del", name] if kind == "link" else ["ip", "netns", "del", name]
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        if done.returncode != 0 and exists(kind, name):
            left.append(f"{kind} {name}")
    if not left:
        os.unlink(record)
    return left


def clean_up():
    """Remove the networks of local runs whose process is gone (killed before it could clean up);
    their records are /run/ddpn<pid>.network."""
    removed = []
    for name in os.listdir("/run"):
        match = re.fullmatch(rf"({PREFIX}(\d+))\.network", name)
        if match and not os.path.exists(f"/proc/{match.group(2)}"):
            tear_down(os.path.join("/run", name))
            removed.append(match.group(1))
    return removed


def exists(kind, name):
    """Whether a link or a namespace of this name is there now."""
    return name in (namespaces() if kind == "netns" else links())


def namespaces():
    """Names of the network namespaces `ip netns` knows."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in listed.stdout.splitlines() if line.strip()]


def links():
    """Names of the root namespace's links."""
    listed = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                            timeout=30)
    return [line.split(":")[1].strip().split("@")[0] for line in listed.stdout.splitlines()]


def ours():
    """Every namespace and link whose name starts with PREFIX, as 'kind name'."""
    return ([f"netns {name}" for name in namespaces() if name.startswith(PREFIX)]
            + [f"link {name}" for name in links() if name.startswith(PREFIX)])


def enter_namespace(name):
    """setns(2) into the named network namespace (Python 3.11 has no os.setns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/run/netns/{name}") as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into {name}: {os.strerror(error)}")


@contextlib.contextmanager
def held_signals():
    """SIGINT and SIGTERM wait until the block ends (then arrive as usual)."""
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
