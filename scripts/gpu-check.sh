#!/usr/bin/env bash
# The GPU checks of privmatch, for a machine with an NVIDIA GPU and the CUDA 13 libraries
# (driver, cuBLAS, NVRTC) but no Rust toolchain and no PostgreSQL: the binaries are built
# elsewhere with `scripts/gpu-check.sh --build` (into target/gpu-check/) and carried over.
#
#   scripts/gpu-check.sh --build                       # here: test and benchmark binaries, and
#                                                      # pg-bundle.tar.xz (PostgreSQL with the
#                                                      # extension, the CLI, the e2e test)
#   scripts/gpu-check.sh [--sizes 1000000,...]         # there: every step below
#   scripts/gpu-check.sh --no-bench                    # there: every step but the benchmark
#   scripts/gpu-check.sh --steps e2e,bench [--sizes …] # there: the steps named
#
# Steps: tests (bit-exact against the CPU scan), search (three parties in one process),
# engine (the worker's backend choice), sanitizer (compute-sanitizer memcheck on the small
# tests; sanitizer-large, not in the default list, on the 100,000-row one), e2e (the
# whole search through three PostgreSQL parties and the coordinator, privmatch.gpu = on),
# bench (gpu_scan); bench-iris, not in the default list (`privmatch bench iris` on this host:
# three PostgreSQL parties and the coordinator, first scanning on the GPU, then on the CPU with
# privmatch.engine_threads = $IRIS_THREADS each; N = $IRIS_N, default 100,000). Logs go to $OUT (default target/gpu-check/out). Each step has its own time
# limit, so one hung step does not eat the others' time. docs/gpu.md explains what each shows.
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
    scripts/pg-bundle.sh "$BIN/pg-bundle.tar.xz"
    ls -la "$BIN"
    exit 0
fi
SIZES=1000000
STEPS=tests,search,engine,sanitizer,e2e,bench
while [ $# -gt 0 ]; do
    case "$1" in
        --sizes) SIZES=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --no-bench) STEPS=${STEPS/,bench/}; shift ;;
        *) echo "gpu-check.sh: unknown argument $1 (see the header)" >&2; exit 2 ;;
    esac
done
wanted() { [[ ",$STEPS," == *",$1,"* ]]; }
# A test step whose filter matches no test passes while testing nothing: say so, and fail.
FAILED=""
none_ran() {
    if grep -q '^running 0 tests' "$OUT/$1.log"; then
        echo "$1: no test matched the step's filter: it tested nothing"
        FAILED="$FAILED $1"
    fi
}
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

if wanted tests; then
step "tests (bit-exact against the CPU scan)"
timeout 200 "$BIN/device-tests" --test-threads=1 --nocapture 2>&1 | tee "$OUT/tests.log"
rc=${PIPESTATUS[0]}; echo "tests rc=$rc"; [ "$rc" = 0 ] || FAILED="$FAILED tests"; none_ran tests
fi

if wanted search; then
step "whole searches, three parties scanning on the GPU"
timeout 200 "$BIN/search-tests" --nocapture 2>&1 | tee "$OUT/search.log"
rc=${PIPESTATUS[0]}; echo "search rc=$rc"; [ "$rc" = 0 ] || FAILED="$FAILED search"; none_ran search
fi

if wanted engine; then
step "the engine worker's choice of backend (privmatch.gpu), with the real probe"
timeout 60 "$BIN/engine-tests" engine::iris::backend --nocapture 2>&1 | grep -v '^test .* ok$' | tee "$OUT/engine.log"
rc=${PIPESTATUS[0]}; echo "engine rc=$rc"; [ "$rc" = 0 ] || FAILED="$FAILED engine"; none_ran engine
fi

if wanted sanitizer; then
step "compute-sanitizer memcheck on the small tests"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/device-tests" small_bit_exact small_follows small_two_shards --test-threads=1 2>&1 \
    | tail -40 | tee "$OUT/sanitizer.log"
rc=${PIPESTATUS[0]}; echo "sanitizer rc=$rc"; [ "$rc" = 0 ] || FAILED="$FAILED sanitizer"; none_ran sanitizer
fi

if wanted sanitizer-large; then
step "compute-sanitizer memcheck on the 100,000-row bit-exact test"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$BIN/device-tests" large_bit_exact --test-threads=1 2>&1 \
    | tail -40 | tee "$OUT/sanitizer-large.log"
echo "sanitizer-large rc=${PIPESTATUS[0]}"
fi

if wanted e2e; then
step "the whole search through three PostgreSQL parties and the coordinator, privmatch.gpu = on"
# PostgreSQL, the extension, the CLI and the test come in pg-bundle.tar.xz (scripts/pg-bundle.sh);
# the bundle's libraries that this machine lacks are put on the library path.
PM=/tmp/privmatch-e2e
rm -rf "$PM" && mkdir -p "$PM" && tar -xJf "$BIN/pg-bundle.tar.xz" -C "$PM"
. "$PM/env.sh"
id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
echo "$(postgres --version); $(privmatch --version)"
ldd "$(pg_config --pkglibdir)/privmatch.so" "$(pg_config --bindir)/postgres" | grep 'not found' && echo "e2e: libraries missing"
timeout 420 "$PM/e2e/iris_search_cli" --exact \
    with_gpu_on_searches_scan_on_the_gpu_and_agree_with_the_plaintext_matcher --nocapture 2>&1 \
    | tee "$OUT/e2e.log"
rc=${PIPESTATUS[0]}; echo "e2e rc=$rc"; [ "$rc" = 0 ] || FAILED="$FAILED e2e"; none_ran e2e
fi

if wanted bench-iris; then
step "privmatch bench iris, N = ${IRIS_N:=100000}: three PostgreSQL parties and the coordinator on this host"
PM=/tmp/privmatch-e2e
[ -x "$PM/bin/privmatch" ] || { rm -rf "$PM" && mkdir -p "$PM" && tar -xJf "$BIN/pg-bundle.tar.xz" -C "$PM"; }
. "$PM/env.sh"
id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
export PRIVMATCH_HOME=/tmp/privmatch-bench-iris
rm -rf "$PRIVMATCH_HOME"
timeout 120 privmatch cluster up 2>&1 | tail -3
echo "-- the GPU scan (privmatch.gpu = auto)"
timeout 400 privmatch bench iris --n "$IRIS_N" --repetitions 5 2>&1 | tee "$OUT/bench-iris-gpu.log"
echo "bench-iris gpu rc=${PIPESTATUS[0]}"
privmatch cluster down 2>&1 | tail -1
for p in 0 1 2; do
    printf "privmatch.gpu = off\nprivmatch.engine_threads = %s\n" "${IRIS_THREADS:=5}" >>"$PRIVMATCH_HOME/p$p/data/postgresql.conf"
done
timeout 120 privmatch cluster up 2>&1 | tail -1
echo "-- the CPU scan (privmatch.gpu = off, privmatch.engine_threads = $IRIS_THREADS)"
timeout 200 privmatch bench iris --n "$IRIS_N" --reuse --repetitions 5 2>&1 | tee "$OUT/bench-iris-cpu.log"
echo "bench-iris cpu rc=${PIPESTATUS[0]}"
privmatch cluster down 2>&1 | tail -1
fi

finish() { [ -z "$FAILED" ] || { echo "failed:$FAILED"; exit 1; }; exit 0; }
wanted bench || finish
step "benchmark (N = $SIZES)"
timeout 230 "$BIN/gpu_scan" --n "$SIZES" --reps 5 2>&1 | tee "$OUT/bench.log"
echo "bench rc=${PIPESTATUS[0]}"
finish
