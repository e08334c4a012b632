#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what is missing (scripts/setup.sh), builds
# the workspace (plugins are .so files the tests load at run time), then runs every test.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"
bash scripts/setup.sh
cargo fmt --all -- --check
cargo build --workspace --all-targets
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --no-fail-fast "$@"
