"""An emulated network on one machine: each host (a local rank, or a slurmd node) in its own network
namespace, joined to a Linux bridge by a veth pair whose two ends are both shaped by `tc tbf`.

One host's processes talk over its namespace's loopback (unshaped, like the fast links inside a
node); hosts talk over their shaped links. Every host's interface has the same name, INTERFACE,
so one GLOO_SOCKET_IFNAME fits all. Needs root, `ip` and `tc`; the kernel here has no netem, so
bandwidth is shaped but no delay is added.

    python mlp_ddp.py --world-size 2 --emulate-link 1gbit                 # one namespace per rank
    python mlp_ddp.py --world-size 4 --emulate-link 1gbit --ranks-per-node 2   # 2 nodes x 2 ranks
    python -m benchmarks.allreduce_bench --world-sizes 2 --emulate-link 1gbit
    python3 -m runtime.emulated_network up --tag ddpnX --hosts 2 --rate 1gbit --record FILE
    python3 -m runtime.emulated_network down --record FILE    # what `up` recorded, nothing else
    python3 -m runtime.emulated_network list                  # what of ours exists now
    python3 -m runtime.emulated_network clean-up              # leftovers of killed local runs

Every name starts with PREFIX; a local run's tag holds its pid, so two runs never collide and a
run killed by SIGKILL is found by `clean-up`. Each object is written to the record file before it
is made, so `down` removes everything, also after a start that failed midway. Standard library
only: slurm/start_local_cluster.sh runs this file with the system's python3.
"""
import argparse
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys

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


# --- The options of mlp_ddp.py and benchmarks.allreduce_bench ------------------------------------

def rate_option(text):
    """An argparse type: a tc rate, kept as written (parse_rate checks it)."""
    try:
        parse_rate(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def add_options(parser):
    """--emulate-link and --ranks-per-node."""
    parser.add_argument("--emulate-link", type=rate_option, default=None, metavar="RATE",
                        help="local launch only, as root: every node in its own network "
                             "namespace behind a link shaped to RATE both ways (tc syntax: "
                             "100mbit, 1gbit)")
    parser.add_argument("--ranks-per-node", type=int, default=1, metavar="K",
                        help="with --emulate-link: K ranks share a node (its loopback is not "
                             "shaped), e.g. 4 ranks as 2 nodes x 2")


def check_options(parser, args):
    """After parsing: a --emulate-link that cannot work here is one line and exit 2."""
    if args.ranks_per_node < 1:
        parser.error(f"--ranks-per-node must be >= 1, got {args.ranks_per_node}")
    if args.emulate_link:
        try:
            check_usable()
        except NetworkUnavailable as error:
            parser.error(str(error))


def for_local_ranks(args, world_size):
    """The network a local launch of `world_size` ranks runs on (None without --emulate-link):
    ranks r*K..r*K+K-1 share node r."""
    rate = getattr(args, "emulate_link", None)
    if not rate:
        return contextlib.nullcontext()
    per_node = getattr(args, "ranks_per_node", 1)
    return EmulatedNetwork(f"{PREFIX}{os.getpid()}", -(-world_size // per_node), rate)


def host_of(rank, args):
    """The node (namespace index) of a local rank."""
    return rank // getattr(args, "ranks_per_node", 1)


def describe(args):
    """The emulated link for a results file; None when the network was not emulated."""
    if not getattr(args, "emulate_link", None):
        return None
    return {"rate": args.emulate_link, "bits_per_s": parse_rate(args.emulate_link),
            "ranks_per_node": args.ranks_per_node, "shaper": "tc tbf, both ends of each veth"}


# --- Command line, for the local SLURM cluster and for cleaning up --------------------------------

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


class _OneLineParser(argparse.ArgumentParser):
    """A bad argument is one line and exit 2 (runtime.options has the same; this file imports
    nothing of the project's, for the system's python3)."""

    def error(self, message):
        """Leave with `message` alone."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv=None):
    """check / up / down / list / clean-up; exit 2 with one line when the network cannot be
    made."""
    parser = _OneLineParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="can a network of this rate be made here?")
    check.add_argument("--rate", type=rate_option, required=True)
    up = commands.add_parser("up", help="make a network and record what was made")
    up.add_argument("--tag", required=True, help=f"name prefix, starting with {PREFIX}")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--rate", type=rate_option, required=True)
    up.add_argument("--subnet", default=DEFAULT_SUBNET, help="the first three octets")
    up.add_argument("--bridge-address", action="store_true",
                    help=f"give the bridge SUBNET.{BRIDGE_HOST}, so the root namespace reaches "
                         "the hosts")
    up.add_argument("--record", required=True)
    down = commands.add_parser("down", help="remove what a record names")
    down.add_argument("--record", required=True)
    commands.add_parser("list", help="our namespaces and links present now")
    commands.add_parser("clean-up", help="remove the networks of local runs no longer running")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            check_usable()
        elif args.command == "up":
            if not args.tag.startswith(PREFIX) or len(args.tag) > 12:
                raise NetworkUnavailable(f"--tag must start with {PREFIX} and have at most 12 "
                                         "characters (interface names have 15)")
            check_usable()
            with held_signals():
                EmulatedNetwork(args.tag, args.hosts, args.rate, args.subnet,
                                args.bridge_address, args.record).up()
        elif args.command == "down":
            left = tear_down(args.record)
            if left:
                raise NetworkUnavailable(f"could not remove: {', '.join(left)}")
        elif args.command == "list":
            print("\n".join(ours()))
        else:
            print("\n".join(f"removed {tag}" for tag in clean_up()))
    except NetworkUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
