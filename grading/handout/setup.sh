#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image; the zip's contents are
# in /autograder/source. It installs Python and the pinned requirements into /autograder/venv
# (torch's CPU build where the machine has no GPU, as Gradescope's has none: 1.2 GB instead of
# 4.8 GB of CUDA libraries), and fetches the real MNIST if it can (without it the accuracy test is
# "not assessed", never 0).
set -euo pipefail
ROOT=${AUTOGRADER_ROOT:-/autograder}
SOURCE="$ROOT/source"

apt-get update
apt-get install -y python3 python3-venv python3-pip curl
python3 -m venv "$ROOT/venv"
"$ROOT/venv/bin/pip" install --upgrade pip
if ! nvidia-smi >/dev/null 2>&1; then
    # the pins of requirements.txt, from torch's CPU index; the CUDA build is the fallback (the
    # grader's memory limit holds for either)
    pins=$(grep -E '^(torch|torchvision)==' "$SOURCE/requirements.txt")
    # shellcheck disable=SC2086
    "$ROOT/venv/bin/pip" install --index-url https://download.pytorch.org/whl/cpu $pins ||
        echo "torch's CPU index could not be reached: installing the default build"
fi
"$ROOT/venv/bin/pip" install -r "$SOURCE/requirements.txt"

# The four files and MD5s of torchvision's MNIST.resources, from its first mirror.
RAW="$ROOT/data/MNIST/raw"
mkdir -p "$RAW"
fetched=yes
while read -r name md5; do
    if ! curl --fail --silent --show-error --location --retry 3 \
            -o "$RAW/$name" "https://ossci-datasets.s3.amazonaws.com/mnist/$name" ||
        ! echo "$md5  $RAW/$name" | md5sum --check --status; then
        fetched=no
    fi
done <<'FILES'
train-images-idx3-ubyte.gz f68b3c2dcbeaaa9fbdd348bbdeb94873
train-labels-idx1-ubyte.gz d53e105ee54ea40749a09fcbcd1e9432
t10k-images-idx3-ubyte.gz 9fb629c4189551a2d022fa330f9573f3
t10k-labels-idx1-ubyte.gz ec29112dd5afa0611ce80d1b7f02629c
FILES
if [ "$fetched" = no ]; then
    rm -rf "$ROOT/data"
    echo "MNIST could not be fetched: the tests that need it will be not assessed"
fi
