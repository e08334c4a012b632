#!/usr/bin/env bash
# Runs a command with libtorch's MKL taking its Intel branch on any CPU, to record the
# `intel-*` fixtures on a machine that is not an Intel one (cairn_torch::CpuClass).
#
#   bash scripts/fidelity/mkl_intel_branch.sh COMMAND [ARGS...]
#
# MKL asks two functions whether the CPU is an Intel one and takes its generic branch when they
# say no. They are called through the PLT, so a preloaded library that answers yes makes MKL
# take the same kernels an Intel CPU with the same ISA gets. Checked against an Intel Xeon's CI
# run: the AMD EPYC under this script printed the Xeon's golden `sft_loss` and bf16 log-prob
# differences to the last digit (tests/fixtures/sync-golden/README.md).
#
# For recording fixtures only: Cairn itself never sets this, and a user's run takes MKL's own
# choice.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir="$root/target/mkl-intel-branch"
lib="$dir/libmkl_intel_branch.so"
if [ ! -f "$lib" ]; then
    mkdir -p "$dir"
    printf '%s\n' 'int mkl_serv_intel_cpu_true(void) { return 1; }' \
        'int mkl_serv_intel_cpu(void) { return 1; }' > "$dir/shim.c"
    gcc -O2 -shared -fPIC -o "$lib" "$dir/shim.c"
fi
LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}" exec "$@"
