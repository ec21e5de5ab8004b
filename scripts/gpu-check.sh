#!/usr/bin/env bash
# The GPU checks of privmatch-gpu, for a machine with an NVIDIA GPU and the CUDA 13 libraries
# (driver, cuBLAS, NVRTC) but no Rust toolchain: the binaries are built elsewhere with
# `scripts/gpu-check.sh --build` (into target/gpu-check/) and carried over.
#
#   scripts/gpu-check.sh --build                 # here: build the test and benchmark binaries
#   scripts/gpu-check.sh [--sizes 1000000,...]   # there: tests, compute-sanitizer, benchmark
#   scripts/gpu-check.sh --no-bench             # there: the tests only
#
# Logs go to $OUT (default target/gpu-check/out). Each step has its own time limit, so one hung
# step does not eat the others' time. docs/gpu.md explains what each step shows.
set -u
cd "$(dirname "$0")/.."
BIN=target/gpu-check
if [ "${1:-}" = "--build" ]; then
    set -e
    mkdir -p "$BIN"
    for t in device search; do
        test_bin=$(cargo test --release -p privmatch-gpu --test $t --no-run --message-format=json 2>/dev/null \
            | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' $t)
        cp "$test_bin" "$BIN/$t-tests"
    done
    engine_bin=$(cd extension && cargo test --release --lib --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "privmatch":
        print(m["executable"])')
    cp "$engine_bin" "$BIN/engine-tests"
    cargo build --release -p privmatch-gpu --example gpu_scan
    cp target/release/examples/gpu_scan "$BIN/gpu_scan"
    ls -la "$BIN"
    exit 0
fi
SIZES=1000000
[ "${1:-}" = "--sizes" ] && SIZES=$2
[ "${1:-}" = "--no-bench" ] && SIZES=
OUT=${OUT:-$BIN/out}
mkdir -p "$OUT"
step() { echo; echo "== $* ($(date -u +%T))"; }

step "device"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
lscpu | grep -E 'Model name|^CPU\(s\)|Flags' | cut -c1-400

step "CUDA libraries"
libs=$(find /usr/local /opt /usr/lib -xdev \( -name 'libcublas.so.13*' -o -name 'libnvrtc.so.13*' -o -name 'libcublasLt.so.13*' \) 2>/dev/null | xargs -r -n1 dirname | sort -u | tr '\n' ':')
export LD_LIBRARY_PATH="${libs}${LD_LIBRARY_PATH:-}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

step "tests (bit-exact against the CPU scan)"
timeout 200 "$BIN/device-tests" --test-threads=1 --nocapture 2>&1 | tee "$OUT/tests.log"
echo "tests rc=${PIPESTATUS[0]}"

step "whole searches, three parties scanning on the GPU"
timeout 200 "$BIN/search-tests" --nocapture 2>&1 | tee "$OUT/search.log"
echo "search rc=${PIPESTATUS[0]}"

step "the engine worker's choice of backend (privmatch.gpu), with the real probe"
timeout 60 "$BIN/engine-tests" engine::worker --nocapture 2>&1 | grep -v '^test .* ok$' | tee "$OUT/engine.log"
echo "engine rc=${PIPESTATUS[0]}"

step "compute-sanitizer memcheck on the small tests"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/device-tests" small_bit_exact small_follows small_two_shards --test-threads=1 2>&1 \
    | tail -40 | tee "$OUT/sanitizer.log"
echo "sanitizer rc=${PIPESTATUS[0]}"

[ -z "$SIZES" ] && exit 0
step "benchmark (N = $SIZES)"
timeout 230 "$BIN/gpu_scan" --n "$SIZES" --reps 5 2>&1 | tee "$OUT/bench.log"
echo "bench rc=${PIPESTATUS[0]}"
