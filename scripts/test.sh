#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what is missing (scripts/setup.sh), builds
# the workspace (plugins are .so files the tests load at run time), then runs every test.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"
# A CI run builds from a clean clone once: incremental compilation's caches (2.3 GB of writes
# for this workspace) would never be read back. Locally they are kept for the next edit.
if [ -n "${CI:-}" ]; then
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
fi
bash scripts/setup.sh
cargo fmt --all -- --check
cargo build --workspace --all-targets
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --no-fail-fast "$@"
