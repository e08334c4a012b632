#!/usr/bin/env bash
# Copies the third-party tokenizer, golden-id and chat-template files the text tests need from
# the development share (default: ../shared beside the checkout) into kernel/fixtures/text/.
# Tests read only the copies; see kernel/fixtures/text/NOTICE.md for sources and licences.
#
#   scripts/text/copy_fixtures.sh [SHARED_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
shared="${1:-$root/../shared}"
dest="$root/kernel/fixtures/text"
mkdir -p "$dest/qwen3" "$dest/qwen2-golden" "$dest/chat-templates"
install -m 0644 "$shared/tokenizers/qwen3/tokenizer.json" "$shared/tokenizers/qwen3/tokenizer_config.json" "$dest/qwen3/"
install -m 0644 "$shared/tokenizers/qwen2-golden/ggml-vocab-qwen2.gguf.inp" \
    "$shared/tokenizers/qwen2-golden/ggml-vocab-qwen2.gguf.out" "$dest/qwen2-golden/"
install -m 0644 "$shared"/chat-templates/*.jinja "$dest/chat-templates/"
echo "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  $dest/qwen3/tokenizer.json" | sha256sum -c -
