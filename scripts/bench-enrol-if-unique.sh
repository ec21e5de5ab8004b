#!/usr/bin/env bash
# Enroll-if-unique throughput with concurrent callers: batched (0.16.0, docs/protocols/iris.md
# §13.4: one lock, one enrolment batch and one commit per batch) against one request per
# transaction (`--batch-max 1`, the behaviour before 0.16.0), measured in the same run on the
# same local cluster, and the ratio.
#
#   scripts/bench-enrol-if-unique.sh [--base N] [--callers C] [--per K] [--link-delay-ms D]
#
# A local cluster (three PostgreSQL parties and the coordinator) with N enrolled templates
# (default 1,000); C concurrent `privmatch iris enroll --if-unique` callers (default 16), each
# with K new, distinct templates (default 4), first with the coordinator's default batching,
# then with the coordinator restarted with PRIVMATCH_BATCH_MAX=1 (new templates again). Prints
# requests/s of each and batched / unbatched; checks that every request was enrolled at the
# three parties. Needs scripts/setup.sh first (the extension installed, the CLI built).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PM=${PM:-$ROOT/target/release/privmatch}
base=1000 callers=16 per=4 delay=0
while [ $# -gt 0 ]; do
  case "$1" in
    --base) base=$2; shift 2 ;;
    --callers) callers=$2; shift 2 ;;
    --per) per=$2; shift 2 ;;
    --link-delay-ms) delay=$2; shift 2 ;;
    *) echo "usage: $0 [--base N] [--callers C] [--per K] [--link-delay-ms D]" >&2; exit 2 ;;
  esac
done
[ -x "$PM" ] || { echo "bench-enrol-if-unique: no CLI at $PM: run scripts/setup.sh first" >&2; exit 1; }
work=$(mktemp -d /tmp/pm-enrol-bench.XXXXXX)
chmod 0755 "$work"
home=$work/home
port=17600
say() { echo "==> $*" >&2; }
up() {
  "$PM" --home "$home" cluster up --base-port $port --coordinator-port $((port + 9)) \
    --link-delay-ms "$delay" >/dev/null
}
finish() {
  "$PM" --home "$home" cluster down --purge >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap finish EXIT

say "cluster with $base enrolled templates (link delay $delay ms)"
up
"$PM" iris synth "$base" --seed 21 -o "$work/base.ndjson"
"$PM" --home "$home" iris enroll --input "$work/base.ndjson" --no-progress >/dev/null

records() { "$PM" --home "$home" cluster status 2>/dev/null | grep -o '[0-9]* iris' | awk '{s = s " " $1} END {print s}'; }

# run LABEL SEED: C callers × K new templates; prints the requests per second.
run() {
  local label=$1 seed=$2 total=$((callers * per))
  "$PM" iris synth "$total" --seed "$seed" -o "$work/$label.ndjson"
  sed -i "s/\"synth-/\"$label-/" "$work/$label.ndjson"
  split -n "l/$callers" -d "$work/$label.ndjson" "$work/$label-part-"
  local start end pids=()
  start=$(date +%s.%N)
  for part in "$work/$label"-part-*; do
    "$PM" --home "$home" iris enroll --input "$part" --if-unique --no-progress >"$part.out" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$work/$label"-part-*.out >&2; exit 1; }; done
  end=$(date +%s.%N)
  local enrolled
  enrolled=$(cat "$work/$label"-part-*.out | grep -o 'enrolled [0-9]*' | awk '{s += $2} END {print s + 0}')
  [ "$enrolled" = "$total" ] || { echo "FAIL: $label enrolled $enrolled of $total" >&2; exit 1; }
  awk -v n="$total" -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", n / (e - s) }'
}

say "batched (coordinator defaults): $callers callers × $per requests"
batched=$(run batched 22)
batches=$(grep -c "iris enrolment batch" "$home/coordinator.log" || true)
say "one request per transaction (PRIVMATCH_BATCH_MAX=1): $callers callers × $per requests"
"$PM" --home "$home" cluster down >/dev/null
PRIVMATCH_BATCH_MAX=1 up
single=$(run single 23)
after=$(records)
want=$((base + 2 * callers * per))
[ "$(echo "$after" | wc -w)" = 3 ] || { echo "FAIL: cluster status gave no record counts ($after)" >&2; exit 1; }
for n in $after; do
  [ "$n" = "$want" ] || { echo "FAIL: a party holds $n iris records, expected $want ($after)" >&2; exit 1; }
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
features=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512vnni|avx512ifma|vaes|sha_ni)$' | tr '\n' ' ')
echo "enroll-if-unique, $callers concurrent callers × $per new templates over $base enrolled, link delay $delay ms"
echo "machine: $cpu, $(nproc) cores; $features"
echo "batched:                     $batched requests/s ($batches enrolment batches)"
echo "one request per transaction: $single requests/s"
awk -v b="$batched" -v s="$single" 'BEGIN { printf "batched / one per transaction: %.2f\n", b / s }'
echo "every request enrolled at all three parties ($want records each)"
