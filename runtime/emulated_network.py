"""How a run asks for an emulated network (runtime/shaped_links.py builds it): the --emulate-link
and --ranks-per-node options, the network of a local launch, and the command line with which
slurm/start_local_cluster.sh brings its network up and takes it down.

    python mlp_ddp.py --world-size 2 --emulate-link 1gbit                 # one namespace per rank
    python mlp_ddp.py --world-size 4 --emulate-link 1gbit --ranks-per-node 2   # 2 nodes x 2 ranks
    python -m benchmarks.allreduce_bench --world-sizes 2 --emulate-link 1gbit
    python3 -m runtime.emulated_network up --tag ddpnX --hosts 2 --rate 1gbit --record FILE
    python3 -m runtime.emulated_network down --record FILE    # what `up` recorded, nothing else
    python3 -m runtime.emulated_network list                  # what of ours exists now
    python3 -m runtime.emulated_network clean-up              # leftovers of killed local runs

Standard library only, like shaped_links.py: the cluster scripts run this file with the system's
python3.
"""
import argparse
import contextlib
import os
import sys

from runtime import shaped_links

# --- The options of mlp_ddp.py and benchmarks.allreduce_bench, and a local launch's network ------

def rate_option(text):
    """An argparse type: a tc rate, kept as written (shaped_links.parse_rate checks it)."""
    try:
        shaped_links.parse_rate(text)
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
            shaped_links.check_usable()
        except shaped_links.NetworkUnavailable as error:
            parser.error(str(error))


def for_local_ranks(args, world_size):
    """The network a local launch of `world_size` ranks runs on (None without --emulate-link):
    ranks r*K..r*K+K-1 share node r."""
    rate = getattr(args, "emulate_link", None)
    if not rate:
        return contextlib.nullcontext()
    per_node = getattr(args, "ranks_per_node", 1)
    tag = f"{shaped_links.PREFIX}{os.getpid()}"
    return shaped_links.EmulatedNetwork(tag, -(-world_size // per_node), rate)


def host_of(rank, args):
    """The node (namespace index) of a local rank."""
    return rank // getattr(args, "ranks_per_node", 1)


def describe(args):
    """The emulated link for a results file; None when the network was not emulated."""
    if not getattr(args, "emulate_link", None):
        return None
    return {"rate": args.emulate_link, "bits_per_s": shaped_links.parse_rate(args.emulate_link),
            "ranks_per_node": args.ranks_per_node, "shaper": "tc tbf, both ends of each veth"}


# --- Command line, for the local SLURM cluster and for cleaning up --------------------------------

class _OneLineParser(argparse.ArgumentParser):
    """A bad argument is one line and exit 2 (runtime.options has the same; this file imports
    nothing of the project's but shaped_links.py, for the system's python3)."""

    def error(self, message):
        """Leave with `message` alone."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv=None):
    """check / up / down / list / clean-up; exit 2 with one line when the network cannot be
    made."""
    # --help describes what the commands manage: the network itself
    parser = _OneLineParser(description=shaped_links.__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("check", help="can a network of this rate be made here?")
    check.add_argument("--rate", type=rate_option, required=True)
    up = commands.add_parser("up", help="make a network and record what was made")
    up.add_argument("--tag", required=True,
                    help=f"name prefix, starting with {shaped_links.PREFIX}")
    up.add_argument("--hosts", type=int, default=2)
    up.add_argument("--rate", type=rate_option, required=True)
    up.add_argument("--subnet", default=shaped_links.DEFAULT_SUBNET,
                    help="the first three octets")
    up.add_argument("--bridge-address", action="store_true",
                    help=f"give the bridge SUBNET.{shaped_links.BRIDGE_HOST}, so the root "
                         "namespace reaches the hosts")
    up.add_argument("--record", required=True)
    down = commands.add_parser("down", help="remove what a record names")
    down.add_argument("--record", required=True)
    commands.add_parser("list", help="our namespaces and links present now")
    commands.add_parser("clean-up", help="remove the networks of local runs no longer running")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            shaped_links.check_usable()
        elif args.command == "up":
            if not args.tag.startswith(shaped_links.PREFIX) or len(args.tag) > 12:
                raise shaped_links.NetworkUnavailable(
                    f"--tag must start with {shaped_links.PREFIX} and have at most 12 characters "
                    "(interface names have 15)")
            shaped_links.check_usable()
            with shaped_links.held_signals():
                shaped_links.EmulatedNetwork(args.tag, args.hosts, args.rate, args.subnet,
                                             args.bridge_address, args.record).up()
        elif args.command == "down":
            left = shaped_links.tear_down(args.record)
            if left:
                raise shaped_links.NetworkUnavailable(f"could not remove: {', '.join(left)}")
        elif args.command == "list":
            print("\n".join(shaped_links.ours()))
        else:
            print("\n".join(f"removed {tag}" for tag in shaped_links.clean_up()))
    except shaped_links.NetworkUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
