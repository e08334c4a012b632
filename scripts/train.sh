#!/usr/bin/env bash
# The main job, from a fresh clone: installs what is missing (scripts/setup.sh), builds the
# release binary and the plugins, and runs `cairn train` (the embedded default config unless
# arguments are given, e.g. `scripts/train.sh my-pipeline.toml`).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"
bash scripts/setup.sh
cargo build --release
exec target/release/cairn train "$@"
