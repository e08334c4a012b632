#!/usr/bin/env bash
# SmolLM2-135M-Instruct as a Hugging Face model directory, for the SmolLM2 example configs:
# fetches the GGUF if missing (scripts/setup.sh), builds the release binary and plugins (the
# `arith` environment of examples/smollm2-*.toml among them) if needed, and
# imports `.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf` into
# `.cache/models/smollm2-135m-instruct/` once. A directory whose `cairn-import.json` records
# the GGUF's sha256 is kept; any other one there is refused.
# Prints the directory. The weights are the Q4_1 values dequantized to f32 (docs/models.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$CAIRN_ROOT"
bash scripts/setup.sh

GGUF="$CAIRN_ROOT/.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT="$CAIRN_ROOT/.cache/models/smollm2-135m-instruct"
SHA="$(sha256sum "$GGUF" | cut -c1-64)"

cargo build --release
if [ -f "$OUT/cairn-import.json" ] && grep -q "\"source_sha256\": \"$SHA\"" "$OUT/cairn-import.json"; then
    echo "$OUT"
    exit 0
fi
if [ -e "$OUT" ]; then
    echo "smollm2: $OUT is not an import of $GGUF (sha256 $SHA); delete it to import again" >&2
    exit 1
fi
target/release/cairn import gguf "$GGUF" "$OUT" >&2
echo "$OUT"
