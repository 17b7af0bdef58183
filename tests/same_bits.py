"""A restructuring must not change a single bit of what training computes: this trains 8 small
configurations (every mode and strategy, compression, accumulation, AMP, the CNN) and compares the
saved parameters of two code versions bit for bit.

    python -m tests.same_bits save before/     # on the code before the change
    python -m tests.same_bits save after/      # on the code after it
    python -m tests.same_bits compare before/ after/

Same machine, same torch: bit identity across machines is not expected (summation order and
kernels differ), so this is a tool for one change, not a test.
"""
import argparse
import os
import subprocess
import sys

import torch

SMALL_RUN = ["--epochs", "1", "--max-steps", "12", "--batch-size", "32", "--train-samples", "4096",
             "--val-samples", "256", "--test-samples", "256", "--warmup-steps", "2",
             "--progress-every", "1000"]
CONFIGURATIONS = {
    "single": ["--mode", "single"],
    "ddp-w2": ["--mode", "ddp", "--world-size", "2"],
    "ddp-fp16-accum2-w2": ["--mode", "ddp", "--world-size", "2", "--compress", "fp16",
                           "--accum-steps", "2"],
    "manual-per-param-w2": ["--mode", "manual", "--sync", "per-param", "--world-size", "2"],
    "manual-flat-bf16-w2": ["--mode", "manual", "--sync", "flat", "--world-size", "2",
                            "--compress", "bf16"],
    "manual-bucketed-amp-accum2-w2": ["--mode", "manual", "--sync", "bucketed", "--bucket-mb",
                                      "0.2", "--world-size", "2", "--amp", "fp16",
                                      "--accum-steps", "2"],
    "manual-ring-w3": ["--mode", "manual", "--sync", "flat", "--transport", "ring",
                       "--world-size", "3"],
    "manual-shm-cnn-w2": ["--mode", "manual", "--sync", "flat", "--transport", "shm",
                          "--world-size", "2", "--model", "cnn"],
}


def save(folder):
    """Train every configuration; each one's final state_dict goes to folder/<name>.pt."""
    os.makedirs(folder, exist_ok=True)
    for name, options in CONFIGURATIONS.items():
        command = [sys.executable, "mlp_ddp.py", *options, *SMALL_RUN,
                   "--results-dir", os.path.join(folder, "results"), "--run-name", name,
                   "--save-model", os.path.join(folder, f"{name}.pt")]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        print(f"saved {name}")


def compare(before, after):
    """Whether every configuration's parameters and buffers are bit-identical; prints each."""
    identical = True
    for name in CONFIGURATIONS:
        old = torch.load(os.path.join(before, f"{name}.pt"))
        new = torch.load(os.path.join(after, f"{name}.pt"))
        same = old.keys() == new.keys() and all(torch.equal(old[key], new[key]) for key in old)
        identical &= same
        print(f"{name:32} {'bit-identical' if same else 'DIFFERENT'} ({len(old)} tensors)")
    return identical


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("save").add_argument("folder")
    compared = commands.add_parser("compare")
    compared.add_argument("before")
    compared.add_argument("after")
    args = parser.parse_args()
    if args.command == "save":
        save(args.folder)
        return 0
    return 0 if compare(args.before, args.after) else 1


if __name__ == "__main__":
    sys.exit(main())
