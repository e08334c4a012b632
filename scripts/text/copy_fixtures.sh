#!/usr/bin/env bash
# Refreshes the third-party tokenizer, golden-id and chat-template files the text tests need,
# copying them from SOURCE_DIR into kernel/fixtures/text/. SOURCE_DIR is a directory you
# assembled from the upstream sources listed in kernel/fixtures/text/NOTICE.md, laid out as
#   SOURCE_DIR/tokenizers/qwen3/{tokenizer.json,tokenizer_config.json}
#   SOURCE_DIR/tokenizers/qwen2-golden/ggml-vocab-qwen2.gguf.{inp,out}
#   SOURCE_DIR/chat-templates/*.jinja
# The copies are committed, and tests read only them; nobody needs this script to build or test.
#
#   scripts/text/copy_fixtures.sh SOURCE_DIR
set -euo pipefail
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 SOURCE_DIR  (a directory laid out as described at the top of this script)" >&2
    exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="$1"
dest="$root/kernel/fixtures/text"
mkdir -p "$dest/qwen3" "$dest/qwen2-golden" "$dest/chat-templates"
install -m 0644 "$src/tokenizers/qwen3/tokenizer.json" "$src/tokenizers/qwen3/tokenizer_config.json" "$dest/qwen3/"
install -m 0644 "$src/tokenizers/qwen2-golden/ggml-vocab-qwen2.gguf.inp" \
    "$src/tokenizers/qwen2-golden/ggml-vocab-qwen2.gguf.out" "$dest/qwen2-golden/"
install -m 0644 "$src"/chat-templates/*.jinja "$dest/chat-templates/"
echo "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  $dest/qwen3/tokenizer.json" | sha256sum -c -
