#!/usr/bin/env bash
# The suite's core on the oldest torch the code runs on (torch 2.6; runtime/torch_compat.py takes
# the older names where 2.6 lacks the newer ones), in a virtual environment of its own:
#
#   .ci/test_oldest_torch.sh              # makes .venv-torch2.6 the first time, then runs the core
#   .ci/test_oldest_torch.sh -x -k ring   # extra arguments go to pytest
#
# PyPI's torch 2.6.0 is a CUDA build: the install is about 5 GB and took 81 s here. A test that
# hangs ends the run after 300 s with every thread's stack (faulthandler), not never.
# Settings: PYTHON (default python3), VENV (default .venv-torch2.6).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv-torch2.6}
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    # torchvision 0.21.0 is the release that pairs with torch 2.6.0; numpy 2.2 supports both
    "$VENV/bin/pip" install --quiet torch==2.6.0 torchvision==0.21.0 numpy==2.2.6 pytest==9.2.0
fi
exec "$VENV/bin/python" -m pytest -q -o faulthandler_timeout=300 \
    -o faulthandler_exit_on_timeout=true \
    tests/test_ddp_parity.py tests/test_cli.py tests/test_gradient_sync.py tests/test_device.py \
    tests/test_torch_compat.py "$@"
