#!/usr/bin/env bash
# Installs what Cairn needs into the project: a venv with PyTorch (libtorch for tch) and the
# Python packages the tests compare against. Idempotent: a second run only checks.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"

TORCH_VERSION=2.11.0
REQS="$CAIRN_ROOT/scripts/requirements.txt"
STAMP="$VIRTUAL_ENV/.cairn-setup-$(sha256sum "$REQS" | cut -c1-16)"

if [ ! -x "$VIRTUAL_ENV/bin/python" ]; then
    echo "setup: creating $VIRTUAL_ENV"
    python3 -m venv "$VIRTUAL_ENV"
fi
if [ ! -f "$STAMP" ]; then
    echo "setup: installing torch==$TORCH_VERSION and test requirements from PyPI (about 90 s, 4.6 GB)"
    "$VIRTUAL_ENV/bin/pip" install --quiet --disable-pip-version-check -r "$REQS"
    touch "$STAMP"
fi
"$VIRTUAL_ENV/bin/python" - <<PY
import torch, sys
v = torch.__version__.split("+")[0]
if v != "$TORCH_VERSION":
    sys.exit(f"setup: .venv has torch {torch.__version__}, Cairn needs $TORCH_VERSION; delete .venv and rerun")
PY
