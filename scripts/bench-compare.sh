#!/usr/bin/env bash
# Before/after search benchmark, interleaved on one machine (issue 34: the signatures and the
# sealing must cost at most 5 % of search time).
#
#   scripts/bench-compare.sh OLD_BIN OLD_PGBIN NEW_BIN NEW_PGBIN [ROUNDS]
#
# OLD_BIN / NEW_BIN: the two `privmatch` CLIs. OLD_PGBIN / NEW_PGBIN: the bin directory of the
# PostgreSQL 15 into which the matching extension is installed (initdb, pg_ctl, postgres, psql;
# its pkglibdir and sharedir hold that build's privmatch.so and scripts). Two extension builds
# cannot share one PostgreSQL install, so one of them is normally a relocated copy (see the
# section "Issue 34 before/after" of docs/benchmarks/log.md for how it is made).
#
# For each round (default 3) and each bench it runs OLD then NEW (ABAB…), every run on a fresh
# cluster of its own (`privmatch cluster up` in a new home, purged afterwards):
#
#   iris: `bench iris --n IRIS_N --repetitions 1 --bandwidth-mib 64` enrols the templates
#         (figures discarded), the parties are settled (VACUUM ANALYZE, CHECKPOINT, sync), then
#         the measured run `bench iris --n IRIS_N --reuse --repetitions IRIS_REPS`;
#   face: `bench face --part cluster --n FACE_N --verifies 1 --identifies 1` enrols (discarded),
#         settle, then the measured run `bench face --part cluster --n FACE_N --reuse
#         --verifies FACE_VERIFIES --identifies FACE_IDENTIFIES --json`.
#
# Cluster creation, enrolment and settling are outside the timed part: the figures are the
# search times the benches report themselves (iris: each search's wall time through the
# parties, median per configuration; face: 1:1 verify latency p50/p99 and 1:N identify
# median as the client sees them). It prints every run's figures, the medians per build, the
# ratio new/old, and the machine (CPU model, avx2/avx512*/vaes/aes/sha_ni flags, load).
#
# Environment (defaults): IRIS_N (100000), IRIS_REPS (5), FACE_N (10000), FACE_VERIFIES (300),
# FACE_IDENTIFIES (20), BENCHES ("iris face"), BASE_PORT (15530: P0..P2 on it and the next
# two), COORD_PORT (15539), BENCH_WORK (a new directory under /tmp: logs, outputs,
# results.tsv, summary.txt; the cluster homes live there while they run), NICE (empty: a
# niceness for every command, e.g. 10 while others build — the figures are then not
# meaningful), KEEP_CLUSTERS (unset: purge each cluster after its run).
#
# Exit status: non-zero when a step fails (a cluster does not start, a bench fails or reports
# a result different from the plaintext reference, an output cannot be parsed); never because
# of the ratio. Run it as root (the clusters then run as `postgres`) or as an unprivileged user.
set -euo pipefail

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
if [ $# -lt 4 ] || [ $# -gt 5 ]; then usage; fi
OLD_BIN=$(readlink -f "$1")
OLD_PGBIN=$(readlink -f "$2")
NEW_BIN=$(readlink -f "$3")
NEW_PGBIN=$(readlink -f "$4")
ROUNDS=${5:-3}

IRIS_N=${IRIS_N:-100000}
IRIS_REPS=${IRIS_REPS:-5}
FACE_N=${FACE_N:-10000}
FACE_VERIFIES=${FACE_VERIFIES:-300}
FACE_IDENTIFIES=${FACE_IDENTIFIES:-20}
BENCHES=${BENCHES:-"iris face"}
BASE_PORT=${BASE_PORT:-15530}
COORD_PORT=${COORD_PORT:-15539}
NICE=${NICE:-}

die() {
  echo "bench-compare: $*" >&2
  exit 1
}
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
for v in ROUNDS IRIS_N IRIS_REPS FACE_N FACE_VERIFIES FACE_IDENTIFIES BASE_PORT COORD_PORT; do
  is_count "${!v}" || die "$v must be a positive integer (got '${!v}')"
done
[ -z "$NICE" ] || [[ $NICE =~ ^-?[0-9]+$ ]] || die "NICE must be an integer (got '$NICE')"
for b in $BENCHES; do
  case $b in iris | face) ;; *) die "BENCHES: unknown bench '$b' (iris, face)" ;; esac
done
for side in OLD NEW; do
  bin_var=${side}_BIN pg_var=${side}_PGBIN
  [ -x "${!bin_var}" ] || die "$side privmatch CLI '${!bin_var}' is not an executable"
  for p in initdb pg_ctl postgres psql pg_config; do
    [ -x "${!pg_var}/$p" ] || die "${side}_PGBIN '${!pg_var}' has no $p"
  done
done
[ "$ROUNDS" -ge 3 ] || echo "bench-compare: warning: ROUNDS=$ROUNDS (issue 34 asks for at least 3)" >&2
command -v python3 >/dev/null || die "python3 is needed for the summary"

if [ -n "${BENCH_WORK:-}" ]; then
  WORK=$BENCH_WORK
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d /tmp/pm-bench-compare.XXXXXX)
fi
WORK=$(readlink -f "$WORK")
# The clusters run as `postgres` when this runs as root: it must reach the homes.
chmod 0755 "$WORK"
RESULTS=$WORK/results.tsv
: >"$RESULTS"
ORIG_PATH=$PATH
RUN_PREFIX=()
[ -z "$NICE" ] || RUN_PREFIX=(nice -n "$NICE")

CURRENT_HOME=""
CURRENT_BIN=""
CURRENT_PGBIN=""
cleanup() {
  local rc=$?
  if [ -n "$CURRENT_HOME" ]; then
    echo "bench-compare: stopping the cluster in $CURRENT_HOME" >&2
    PATH="$CURRENT_PGBIN:$ORIG_PATH" "$CURRENT_BIN" --home "$CURRENT_HOME" cluster down --purge \
      >>"$WORK/cleanup.log" 2>&1 || true
    [ -n "${KEEP_CLUSTERS:-}" ] || rm -rf "$CURRENT_HOME"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stamp() { date -u +%H:%M:%S; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# The machine, once.
cpu_model=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' |
  grep -E '^(avx2|avx512.*|vaes|aes|sha_ni|adx|bmi2)$' | sort -u | tr '\n' ' ')
mem_gib=$(awk '/^MemTotal/ {printf "%.0f", $2 / 1048576}' /proc/meminfo)
{
  echo "machine: $cpu_model, $(nproc) CPU(s), ${mem_gib} GiB"
  echo "flags: $cpu_flags"
  echo "old: $OLD_BIN ($("$OLD_BIN" --version 2>/dev/null || echo '?')), PostgreSQL $OLD_PGBIN"
  echo "new: $NEW_BIN ($("$NEW_BIN" --version 2>/dev/null || echo '?')), PostgreSQL $NEW_PGBIN"
  echo "rounds: $ROUNDS; benches: $BENCHES; iris --n $IRIS_N --repetitions $IRIS_REPS;" \
    "face --n $FACE_N --verifies $FACE_VERIFIES --identifies $FACE_IDENTIFIES${NICE:+; nice $NICE}"
  echo "work: $WORK; start $(date -u '+%Y-%m-%d %H:%M:%S UTC'), load $(loadavg)"
} | tee "$WORK/machine.txt"

# VACUUM ANALYZE and CHECKPOINT at the three parties of $home (as the operator role, over each
# party's Unix socket), then sync: the enrolment's autovacuum, checkpoint and writeback must not
# run during the timed searches.
settle() {
  local home=$1 pgbin=$2 i pwfile
  for i in 0 1 2; do
    pwfile=$home/.p$i.password
    [ -r "$pwfile" ] || die "no operator password file $pwfile"
    PGPASSWORD=$(cat "$pwfile") "${RUN_PREFIX[@]}" "$pgbin/psql" -X -q -v ON_ERROR_STOP=1 \
      "host=$home/p$i/run port=$((BASE_PORT + i)) user=privmatch dbname=privmatch" \
      -c 'VACUUM (ANALYZE)' -c 'CHECKPOINT' &
  done
  for i in 0 1 2; do wait -n || die "settling the parties of $home failed"; done
  sync
}

# run_one LABEL BIN PGBIN BENCH ROUND: one fresh cluster, enrol, settle, the measured run.
run_one() {
  local label=$1 bin=$2 pgbin=$3 bench=$4 round=$5
  local name=$bench-r$round-$label
  local home=$WORK/$name log=$WORK/$name.log out=$WORK/$name.out err=$WORK/$name.err
  local load_start load_end t0 t1
  export PATH="$pgbin:$ORIG_PATH"
  rm -rf "$home"
  echo "[$(stamp)] $name: cluster up" >&2
  CURRENT_HOME=$home CURRENT_BIN=$bin CURRENT_PGBIN=$pgbin
  "${RUN_PREFIX[@]}" "$bin" --home "$home" cluster up --base-port "$BASE_PORT" \
    --coordinator-port "$COORD_PORT" --pg-bin "$pgbin" >>"$log" 2>&1 ||
    die "$name: cluster up failed (see $log)"
  echo "[$(stamp)] $name: enrolling" >&2
  case $bench in
    iris)
      "${RUN_PREFIX[@]}" "$bin" --home "$home" bench iris --n "$IRIS_N" --repetitions 1 \
        --bandwidth-mib 64 >>"$log" 2>&1 || die "$name: enrolment run failed (see $log)"
      ;;
    face)
      "${RUN_PREFIX[@]}" "$bin" --home "$home" bench face --part cluster --n "$FACE_N" \
        --verifies 1 --identifies 1 >>"$log" 2>&1 || die "$name: enrolment run failed (see $log)"
      ;;
  esac
  settle "$home" "$pgbin"
  load_start=$(loadavg)
  t0=$(date +%s)
  echo "[$(stamp)] $name: measuring (load $load_start)" >&2
  case $bench in
    iris)
      "${RUN_PREFIX[@]}" "$bin" --home "$home" bench iris --n "$IRIS_N" --reuse \
        --repetitions "$IRIS_REPS" >"$out" 2>"$err" || die "$name: bench iris failed (see $err)"
      ;;
    face)
      "${RUN_PREFIX[@]}" "$bin" --home "$home" bench face --part cluster --n "$FACE_N" --reuse \
        --verifies "$FACE_VERIFIES" --identifies "$FACE_IDENTIFIES" --json >"$out" 2>"$err" ||
        die "$name: bench face failed (see $err)"
      ;;
  esac
  t1=$(date +%s)
  load_end=$(loadavg)
  python3 - "$bench" "$label" "$round" "$out" "$err" "$load_start" "$load_end" "$((t1 - t0))" \
    >>"$RESULTS" <<'PY' || die "$name: cannot parse the bench output ($out, $err)"
import json, re, sys
bench, label, rnd, out, err, load0, load1, secs = sys.argv[1:]
text, errs = open(out).read(), open(err).read()
rows = []
def put(metric, value):
    rows.append((label, rnd, bench, metric, value))
if bench == "iris":
    reps = {0: [], 15: []}
    for m in re.finditer(r"max_rotation\s+(\d+), repetition \d+: ([0-9.]+) s", errs):
        reps[int(m.group(1))].append(m.group(2))
    table = {}
    for m in re.finditer(r"^\s+(1|31)\s+([0-9.]+)\s+(\d+)\s+(\d+)\s+\d+\s+[0-9.]+ / [0-9.]+ / [0-9.]+"
                         r"\s+([0-9.]+)\s+(\d+)\s+([0-9.]+)\s*$", text, re.M):
        table[m.group(1)] = m.groups()
    if set(table) != {"1", "31"} or not reps[0] or not reps[15]:
        sys.exit("iris: the figures table or the repetitions are missing")
    if re.search(r"check, .*WRONG", text) or len(re.findall(r"check, \d+ rotation\(s\): ok", text)) != 2:
        sys.exit("iris: a check is not ok")
    for key, rot in (("a", "1"), ("b", "31")):
        _, wall, rate, rounds, floor, plain, xplain = table[rot]
        put(f"iris_{key}_s", wall)
        put(f"iris_{key}_reps", ",".join(reps[0 if key == "a" else 15]))
        put(f"iris_{key}_x_plaintext", xplain)
        put(f"iris_{key}_rounds", rounds)
    bw = re.search(r"memory: ([0-9.]+) GB/s", text)
    put("iris_bandwidth_gbs", bw.group(1) if bw else "")
    kernel = re.search(r"kernel (\S+)", text)
    put("iris_kernel", kernel.group(1) if kernel else "")
else:
    report = json.loads(text)["cluster"]
    if report.get("wrong", 1) != 0:
        sys.exit("face: answers differ from the plaintext reference")
    ident = re.findall(r"identification (\d+): ([0-9.]+) s over", errs)
    put("face_verify_p50_ms", f"{report['verify_p50_ms']:.3f}")
    put("face_verify_p99_ms", f"{report['verify_p99_ms']:.3f}")
    put("face_identify_s", f"{report['identify_median_s']:.4f}")
    put("face_identify_reps", ",".join(s for k, s in ident if k != "0"))
    put("face_identify_first_s", f"{report['identify_first_s']:.3f}")
    put("face_identify_x_plaintext", f"{report['identify_over_plaintext']:.2f}")
    put("face_identify_stocked", f"{report['identify_stocked']}/{report['identifies']}")
put("load_start", load0)
put("load_end", load1)
put("measured_wall_s", secs)
for r in rows:
    print("\t".join(map(str, r)))
PY
  echo "[$(stamp)] $name: $(awk -F'\t' -v l="$label" -v r="$round" -v b="$bench" \
    '$1 == l && $2 == r && $3 == b && $4 !~ /reps$/ {printf "%s=%s  ", $4, $5}' "$RESULTS")" >&2
  "$bin" --home "$home" cluster down --purge >>"$log" 2>&1 || die "$name: cluster down failed (see $log)"
  [ -n "${KEEP_CLUSTERS:-}" ] || rm -rf "$home"
  CURRENT_HOME=""
  export PATH=$ORIG_PATH
}

started=$(date +%s)
for round in $(seq 1 "$ROUNDS"); do
  for bench in $BENCHES; do
    run_one old "$OLD_BIN" "$OLD_PGBIN" "$bench" "$round"
    run_one new "$NEW_BIN" "$NEW_PGBIN" "$bench" "$round"
  done
done
elapsed=$(($(date +%s) - started))

python3 - "$RESULTS" "$elapsed" "$(loadavg)" <<'PY' | tee "$WORK/summary.txt"
import statistics, sys
from collections import defaultdict
path, elapsed, load = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = defaultdict(dict)  # (label, bench, metric) -> {round: value}
for line in open(path):
    label, rnd, bench, metric, value = line.rstrip("\n").split("\t")
    data[(label, bench, metric)][int(rnd)] = value
def nums(label, bench, metric):
    return [float(v) for _, v in sorted(data.get((label, bench, metric), {}).items()) if v != ""]
def pooled(label, bench, metric):
    out = []
    for _, v in sorted(data.get((label, bench, metric), {}).items()):
        out += [float(x) for x in v.split(",") if x]
    return out
def fmt(xs, digits):
    return ", ".join(f"{x:.{digits}f}" for x in xs)
print()
print("per run (round: value), old | new:")
rows = [("iris", "iris_a_s", "iris (a) 1 rotation, median s", 3),
        ("iris", "iris_b_s", "iris (b) 31 rotations, median s", 3),
        ("iris", "iris_a_x_plaintext", "iris (a) x plaintext", 1),
        ("iris", "iris_b_x_plaintext", "iris (b) x plaintext", 1),
        ("iris", "iris_bandwidth_gbs", "iris memory bandwidth GB/s", 1),
        ("face", "face_verify_p50_ms", "face verify p50 ms", 2),
        ("face", "face_verify_p99_ms", "face verify p99 ms", 2),
        ("face", "face_identify_s", "face identify median s", 4),
        ("face", "face_identify_x_plaintext", "face identify x plaintext", 1)]
for bench, metric, title, d in rows:
    old, new = nums("old", bench, metric), nums("new", bench, metric)
    if old or new:
        print(f"  {title:34} old [{fmt(old, d)}] | new [{fmt(new, d)}]")
for bench in ("iris", "face"):
    loads = [(l, r, v) for (l, b, m), rv in data.items() if b == bench and m == "load_start"
             for r, v in rv.items()]
    if loads:
        print(f"  {bench} load at the start of each measured run: " +
              "; ".join(f"{l} r{r} {v}" for l, r, v in sorted(loads, key=lambda t: (t[1], t[0] != 'old'))))
print()
print("medians over the runs; ratio new/old (the bound of issue 34: <= 1.05):")
def line(title, old, new, d, unit):
    if not old or not new:
        return
    mo, mn = statistics.median(old), statistics.median(new)
    ratio = mn / mo if mo > 0 else float("nan")
    verdict = "within 5 %" if ratio <= 1.05 else "ABOVE 5 %"
    print(f"  {title:44} old {mo:.{d}f}{unit} (range {min(old):.{d}f}-{max(old):.{d}f}, n={len(old)})"
          f"  new {mn:.{d}f}{unit} (range {min(new):.{d}f}-{max(new):.{d}f}, n={len(new)})"
          f"  new/old {ratio:.3f} ({(ratio - 1) * 100:+.1f} %) {verdict}")
line("iris (a) 1 rotation: median of run medians", nums("old", "iris", "iris_a_s"), nums("new", "iris", "iris_a_s"), 3, " s")
line("iris (a) 1 rotation: median of all searches", pooled("old", "iris", "iris_a_reps"), pooled("new", "iris", "iris_a_reps"), 3, " s")
line("iris (b) 31 rotations: median of run medians", nums("old", "iris", "iris_b_s"), nums("new", "iris", "iris_b_s"), 3, " s")
line("iris (b) 31 rotations: median of all searches", pooled("old", "iris", "iris_b_reps"), pooled("new", "iris", "iris_b_reps"), 3, " s")
line("iris (b) x plaintext (same-run baseline)", nums("old", "iris", "iris_b_x_plaintext"), nums("new", "iris", "iris_b_x_plaintext"), 2, "")
line("face verify p50", nums("old", "face", "face_verify_p50_ms"), nums("new", "face", "face_verify_p50_ms"), 2, " ms")
line("face verify p99", nums("old", "face", "face_verify_p99_ms"), nums("new", "face", "face_verify_p99_ms"), 2, " ms")
line("face identify: median of run medians", nums("old", "face", "face_identify_s"), nums("new", "face", "face_identify_s"), 4, " s")
line("face identify: median of all identifications", pooled("old", "face", "face_identify_reps"), pooled("new", "face", "face_identify_reps"), 4, " s")
kernels = sorted({v for (l, b, m), rv in data.items() if m == "iris_kernel" for v in rv.values() if v})
if kernels:
    print(f"  iris scan kernel reported by the engines: {', '.join(kernels)}")
print(f"\nwhole comparison: {elapsed // 60} min {elapsed % 60} s; load at the end {load}")
PY
echo "results: $RESULTS; logs and outputs: $WORK"
