#!/usr/bin/env bash
# privmatch load test: pgbench through the SQL front door, at 1, 2, 4, 8 and 16 clients, against
# a local cluster (`privmatch cluster up`) or the docker compose deployment; then consistency
# checks. tests/pgbench/README.md explains what it measures and how to read the table.
#
#   tests/pgbench/load.sh [--target local|compose] [--clients 1,2,4,8,16] [--duration SECONDS]
#                         [--scripts iris-enroll,iris-identify,...] [--iris N] [--faces N]
#                         [--report FILE] [--keep] [--fault party|coordinator]
#                         [--link-delay-ms MS] [--max-rotation N]
#
# --max-rotation (iris searches; default 15): probes try rotations −N..=N (0: the memory-bound
# case a batch shares the most; 15: the deployed 31 rotations, compute-bound).
#
# --link-delay-ms: every link between the coordinator and a party gets MS of one-way delay,
# both ways, as if the three organisations and the coordinator ran on hosts apart: local, a
# relay in front of each party and of the coordinator (`privmatch cluster up
# --link-delay-ms`); compose, the same relay in the coordinator's container
# (PRIVMATCH_LINK_DELAY_MS, deploy/coordinator-entrypoint.sh).
#
# --fault (compose only): during the 4-client level of iris-enroll and of iris-identify, P1's
# container (party) or the coordinator's is killed a third of the way in and started again at
# two thirds; the errors are in the table, and the consistency checks run after the failed
# enrolments have been resolved (called again with the same input, as an application would).
#
# Each script runs `SELECT privmatch_bench.step(kind, level)` (bench.sql): the next unused sealed
# input of its kind from the staging table, through the front-door function, outcome recorded.
# Inputs are sealed by `privmatch iris|face seal` just before each level (iris probes expire
# after 10 minutes), sized from the throughput measured so far. Needs scripts/setup.sh first
# (the extension, the CLI in target/release, pgbench); the compose target also needs Docker.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/tests/pgbench
PM=${PRIVMATCH_BIN:-$ROOT/target/release/privmatch}

target=local clients=1,2,4,8,16 duration=10 keep=0 report="" fault="" link_delay_ms=0 max_rotation=15
# Searches first, so that every level of a search script sees the same template set.
scripts=iris-identify,iris-uniqueness,iris-enroll,face-verify,face-identify,face-enroll
iris_base=1000 face_base=200
while [ $# -gt 0 ]; do
  case $1 in
    --target) target=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --scripts) scripts=$2; shift 2 ;;
    --iris) iris_base=$2; shift 2 ;;
    --faces) face_base=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --fault) fault=$2; shift 2 ;;
    --link-delay-ms) link_delay_ms=$2; shift 2 ;;
    --max-rotation) max_rotation=$2; shift 2 ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "load.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $target in local | compose) ;; *) echo "load.sh: --target is local or compose" >&2; exit 2 ;; esac
case $fault in "" | party | coordinator) ;; *) echo "load.sh: --fault is party or coordinator" >&2; exit 2 ;; esac
[ -z "$fault" ] || [ "$target" = compose ] || { echo "load.sh: --fault needs --target compose" >&2; exit 2; }
[[ "$max_rotation" =~ ^[0-9]+$ ]] && [ "$max_rotation" -le 15 ] || { echo "load.sh: --max-rotation is 0 to 15" >&2; exit 2; }
[[ "$link_delay_ms" =~ ^[0-9]+$ ]] || { echo "load.sh: --link-delay-ms is a whole number of milliseconds" >&2; exit 2; }
[ -x "$PM" ] || { echo "load.sh: no CLI at $PM: run scripts/setup.sh first" >&2; exit 1; }
command -v pgbench >/dev/null || { echo "load.sh: pgbench is missing (Debian: postgresql-15)" >&2; exit 1; }

# The coordinator serves 32 API requests at once by default; a level of more clients needs
# more (their searches wait in batches, which costs little).
most=$(echo "${clients//,/ }" | tr ' ' '\n' | sort -n | tail -1)
[ "$most" -le 32 ] || export PRIVMATCH_MAX_IN_FLIGHT=$((most * 2 + 16))
work=${PRIVMATCH_LOAD_DIR:-/tmp/privmatch-load-$target}
rm -rf "$work"
mkdir -p "$work/logs"
chmod 0755 "$work"
app=privmatch_load
app_password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
say() { echo "==> load: $*" >&2; }
fail() { echo "FAIL load.sh: $*" >&2; exit 1; }

# --- the target: how to reach the coordinator, the parties as operators, P0 as the application

if [ "$target" = local ]; then
  home=$work/home
  port=17500
  cfg=(--home "$home")
  target_up() {
    "$PM" --home "$home" cluster up --base-port $port --coordinator-port $((port + 9)) \
      --link-delay-ms "$link_delay_ms" >/dev/null
  }
  target_down() { "$PM" --home "$home" cluster down --purge >/dev/null 2>&1 || true; }
  op_sql() { # op_sql PARTY SQL
    PGPASSWORD=$(cat "$home/.p$1.password") PGSSLMODE=require \
      psql -h 127.0.0.1 -p $((port + $1)) -U privmatch -d privmatch -Atq -v ON_ERROR_STOP=1 "${@:2}"
  }
  app_sql() {
    PGPASSWORD=$app_password PGSSLMODE=require \
      psql -h 127.0.0.1 -p $port -U $app -d privmatch -Atq -v ON_ERROR_STOP=1 "$@"
  }
  # run_pgbench CLIENTS SCRIPT LEVEL [LENGTH]: pgbench's output on stdout, its per-transaction
  # log in $work/logs/txn.log; LENGTH is pgbench's option (default: -T the duration).
  run_pgbench() {
    rm -f "$work"/logs/pgbench_log.*
    (cd "$work/logs" && PGPASSWORD=$app_password PGSSLMODE=require \
      pgbench -h 127.0.0.1 -p $port -U $app -n -c "$1" -j "$1" ${4:--T $duration} -D level="$3" \
      -f "$HERE/$2.pgbench" -l privmatch 2>&1) || true
    cat "$work"/logs/pgbench_log.* >"$work/logs/txn.log" 2>/dev/null || : >"$work/logs/txn.log"
  }
  operator_key=()
else
  compose() {
    if docker compose version >/dev/null 2>&1; then (cd "$ROOT" && docker compose "$@"); else (cd "$ROOT" && docker-compose "$@"); fi
  }
  docker info >/dev/null 2>&1 || fail "Docker is not available here"
  export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-privmatch-load}
  export PRIVMATCH_API_PORT=${PRIVMATCH_API_PORT:-18543}
  export PRIVMATCH_SECRETS_DIR=$work/secrets PRIVMATCH_CLIENT_DIR=$work/client
  export PRIVMATCH_LINK_DELAY_MS=$link_delay_ms
  # The images deploy/images.sh builds carry the workspace version (as deploy/smoke.sh uses).
  export PRIVMATCH_TAG=${PRIVMATCH_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/Cargo.toml" | head -n 1)}
  cfg=(--config "$work/client/privmatch.toml")
  target_up() {
    PRIVMATCH_LOCAL_BASE=${PRIVMATCH_LOCAL_BASE:-1} bash "$ROOT/deploy/images.sh" --prebuilt >&2
    compose down -v >/dev/null 2>&1 || true
    bash "$ROOT/deploy/secrets.sh" >/dev/null
    compose up -d >&2
    bash "$ROOT/deploy/ceremony.sh" >&2
    compose exec -T p2 cat /var/lib/privmatch/operator/signing.key >"$work/p2.key"
    chmod 0600 "$work/p2.key"
    compose exec -T p0 mkdir -p /tmp/pgbench
    for f in "$HERE"/*.pgbench; do
      compose exec -T p0 sh -c "cat > /tmp/pgbench/$(basename "$f")" <"$f"
    done
  }
  target_down() { compose down -v >/dev/null 2>&1 || true; }
  op_sql() { compose exec -T "p$1" privmatch-party psql -Atq -v ON_ERROR_STOP=1 "${@:2}"; }
  app_sql() {
    compose exec -T -e PGPASSWORD="$app_password" -e PGSSLMODE=require p0 \
      psql -h 127.0.0.1 -U $app -d privmatch -Atq -v ON_ERROR_STOP=1 "$@"
  }
  run_pgbench() {
    compose exec -T -e PGPASSWORD="$app_password" -e PGSSLMODE=require p0 sh -c \
      "cd /tmp/pgbench && rm -f pgbench_log.* && pgbench -h 127.0.0.1 -U $app -n -c $1 -j $1 ${4:--T $duration} -D level=$3 -f /tmp/pgbench/$2.pgbench -l privmatch 2>&1" || true
    compose exec -T p0 sh -c 'cat /tmp/pgbench/pgbench_log.* 2>/dev/null' >"$work/logs/txn.log" || true
  }
  operator_key=(--operator-key "$work/p2.key")
  # inject_fault SERVICE: kills it a third of the way into the level, starts it at two thirds.
  inject_fault() {
    sleep "$(awk -v d="$duration" 'BEGIN { print d / 3 }')"
    docker kill "$(compose ps -q "$1")" >/dev/null
    say "killed $1"
    sleep "$(awk -v d="$duration" 'BEGIN { print d / 3 }')"
    compose start "$1" >/dev/null
    say "started $1 again"
  }
  wait_healthy() {
    for _ in $(seq 150); do
      [ "$(compose ps | grep -c '(healthy)')" = 4 ] && return
      sleep 2
    done
    fail "the deployment did not become healthy again"
  }
fi
[ "$keep" = 1 ] || trap target_down EXIT

# --- set-up: the deployment, the application login, base data ---------------------------------

say "bringing up the $target deployment"
target_up
op_sql 0 -v app=$app -v password="$app_password" -f - <"$HERE/setup.sql" >/dev/null
app_sql -f - <"$HERE/bench.sql" >/dev/null
cd "$work"
"$PM" iris synth "$iris_base" --seed 11 -o iris-base.ndjson
"$PM" face synth --subjects "$face_base" --dim 128 --seed 11 --out face-base.ndjson --probes face-probes.ndjson >/dev/null
say "enrolling the base sets ($iris_base iris templates, $face_base faces) through the coordinator"
"$PM" "${cfg[@]}" iris enroll --input iris-base.ndjson --no-progress >/dev/null
"$PM" "${cfg[@]}" face configure --metric cosine --threshold 0.7 --dim 128 "${operator_key[@]}" >/dev/null 2>&1
"$PM" "${cfg[@]}" face enroll --input face-base.ndjson --no-progress >/dev/null

# --- inputs ----------------------------------------------------------------------------------

# lines FILE N: N lines of FILE, cycling through it.
lines() { awk -v n="$2" '{ l[NR] = $0 } END { for (i = 0; i < n; i++) print l[i % NR + 1] }' "$1"; }

# seal KIND LEVEL N: seals N inputs of KIND and loads them into the staging table.
seal() {
  local kind=$1 level=$2 n=$3 input=$work/in-$1-$2.ndjson out=$work/in-$1-$2.tsv
  case $kind in
    iris-enroll)
      "$PM" iris synth "$n" --seed $((1000 + level)) | sed "s/\"synth-/\"load-$level-/" >"$input"
      "$PM" "${cfg[@]}" iris seal --for enroll --input "$input" --out "$out" 2>/dev/null ;;
    iris-identify | iris-uniqueness)
      lines iris-base.ndjson "$n" >"$input"
      "$PM" "${cfg[@]}" iris seal --for "${kind#iris-}" --front-door 0 --max-rotation "$max_rotation" \
        --input "$input" --out "$out" 2>/dev/null ;;
    face-enroll)
      "$PM" face synth --subjects "$n" --dim 128 --seed $((1000 + level)) --prefix "load-$level-" \
        --out "$input" >/dev/null
      "$PM" "${cfg[@]}" face seal --for enroll --input "$input" --out "$out" 2>/dev/null ;;
    face-verify)
      lines face-base.ndjson "$n" >"$input"
      "$PM" "${cfg[@]}" face seal --for verify --front-door 0 --input "$input" --out "$out" 2>/dev/null ;;
    face-identify)
      lines face-probes.ndjson "$n" >"$input"
      "$PM" "${cfg[@]}" face seal --for identify --front-door 0 --input "$input" --out "$out" 2>/dev/null ;;
  esac
  app_sql -c "TRUNCATE privmatch_bench.staged" -c "\\copy privmatch_bench.staged FROM pstdin" \
    -c "INSERT INTO privmatch_bench.inputs (kind, level, subject, sealed) SELECT '$kind', $level, subject, sealed FROM privmatch_bench.staged" \
    <"$out" >/dev/null
  rm -f "$input" "$out"
}

# A first guess of each script's throughput at one client (inputs/s), raised as levels run.
guess() {
  case $1 in
    iris-enroll) echo 150 ;; face-enroll) echo 150 ;; face-verify) echo 150 ;; *) echo 30 ;;
  esac
}

# --- the runs --------------------------------------------------------------------------------

# The coordinator's log (the local cluster's file, or the compose container's output): its "iris
# batch" lines say how many searches each batch ran (docs/protocols/iris.md §13.3). Lines now,
# and the batches logged after line $1.
coordinator_log() {
  if [ "$target" = local ]; then
    cat "$home/coordinator.log" 2>/dev/null || true
  else
    compose logs --no-color coordinator 2>/dev/null || true
  fi
}
coordinator_log_lines() { coordinator_log | wc -l; }
batch_sizes() {
  # (awk, not grep: a level without a batch is no error)
  coordinator_log | tail -n +"$(($1 + 1))" | awk '/iris batch/' | sed -n 's/.* probes=\([0-9]*\).*/\1/p' |
    awk '{ n++; s += $1; if ($1 > m) m = $1 } END { if (n == 0) print "-"; else printf "%d, %.1f / %d\n", n, s / n, m }'
}

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
features=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|avx512f|vaes|aes|sha_ni' | sort | tr '\n' ' ')
rows=()
level=0
identify_p50=""  # the lowest p50 of the iris-identify levels (the delayed links' check)
empty_levels=""  # levels that recorded no outcome at all (pgbench did nothing)
for kind in ${scripts//,/ }; do
  [ -f "$HERE/$kind.pgbench" ] || fail "no script $HERE/$kind.pgbench"
  rate=$(guess "$kind")
  # Searches warm up first, unreported: an engine's first search of a set loads it (13 s at
  # 100,000 iris templates), which is no steady-state latency.
  case $kind in
    iris-identify | iris-uniqueness | face-identify | face-verify)
      level=$((level + 1))
      say "$kind: warming up (2 searches, not reported)"
      seal "$kind" "$level" 2
      run_pgbench 1 "$kind" "$level" "-t 2" >"$work/logs/warm-up-$kind.out"
      ;;
  esac
  for c in ${clients//,/ }; do
    # A level whose staging table ran dry (a client aborted) is run again with more inputs.
    for attempt in 1 2 3; do
      level=$((level + 1))
      need=$(awk -v r="$rate" -v d="$duration" -v c="$c" 'BEGIN { print int(r * d * (c > 1 ? 1.6 : 1.3)) + 20 }')
      say "$kind, $c client(s): sealing $need inputs"
      seal "$kind" "$level" "$need"
      say "$kind, $c client(s): pgbench for $duration s"
      faulted=""
      if [ -n "$fault" ] && [ "$c" = 4 ] && { [ "$kind" = iris-enroll ] || [ "$kind" = iris-identify ]; }; then
        faulted=$([ "$fault" = party ] && echo p1 || echo coordinator)
        inject_fault "$faulted" &
      fi
      log_mark=$(coordinator_log_lines)
      out=$(run_pgbench "$c" "$kind" "$level")
      if [ -n "$faulted" ]; then
        wait
        wait_healthy
      fi
      echo "$out" >"$work/logs/pgbench-$kind-$c-$attempt.out"
      tps=$(echo "$out" | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | head -1)
      aborted=$(echo "$out" | grep -c 'aborted in command' || true)
      rate=$(awk -v r="$rate" -v t="${tps:-0}" 'BEGIN { print (t > r ? t : r) }')
      [ "$aborted" = 0 ] && break
      say "$kind, $c client(s): the inputs ran out; again with more"
      rate=$(awk -v r="$rate" 'BEGIN { print r * 1.3 }')
    done
    processed=$(echo "$out" | sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p')
    read -r ok errors codes <<<"$(app_sql -F ' ' -c "SELECT count(*) FILTER (WHERE ok), count(*) FILTER (WHERE NOT ok), coalesce(string_agg(DISTINCT sqlstate, ','), '-') FROM privmatch_bench.outcomes WHERE level = $level")"
    read -r p50 p95 p99 <<<"$(awk '{ print $3 / 1000 }' "$work/logs/txn.log" | sort -n | awk '
      { v[NR] = $1 } END { if (NR == 0) { print "- - -"; exit }
        split("0.50 0.95 0.99", q, " "); s = ""
        for (i = 1; i <= 3; i++) { k = int(q[i] * NR + 0.999999); if (k < 1) k = 1; s = s sprintf("%.1f ", v[k]) }
        print s }')"
    if [ -n "$faulted" ]; then
      note="$faulted killed at $((duration / 3)) s, started at $((2 * duration / 3)) s; "
    else
      note=""
    fi
    if [ "$aborted" != 0 ]; then
      note="$note$aborted client(s) aborted: inputs ran out"
    elif [ "${processed:-0}" = "$((ok + errors))" ]; then
      note="${note}agree (${processed})"
    else
      note="${note}pgbench counted ${processed:-?} transactions, the outcomes $((ok + errors))"
    fi
    [ "$errors" = 0 ] && codes="" || codes=" ($codes)"
    [ "$((ok + errors))" -gt 0 ] || empty_levels="$empty_levels $kind@$c"
    if [ "$kind" = iris-identify ] && [ "$p50" != - ]; then
      identify_p50=$(awk -v a="${identify_p50:-$p50}" -v b="$p50" 'BEGIN { print (b < a ? b : a) }')
    fi
    batches=$(batch_sizes "$log_mark")
    rows+=("| $target | $kind | $c | $(printf '%.1f' "${tps:-0}") | $p50 | $p95 | $p99 | $ok | $errors$codes | $batches | $note |")
    echo "${rows[-1]}" >&2
  done
done

# --- consistency -------------------------------------------------------------------------------

say "consistency checks"
checks=()
resolutions=$(app_sql -F ' ' -c "SELECT resolution, how_many FROM privmatch_bench.resolve()" | tr '\n' ';')
read -r resolved_iris resolved_face <<<"$(app_sql -F ' ' -c "SELECT count(*) FILTER (WHERE kind = 'iris-enroll' AND resolved IN ('committed-before', 'enrolled-now')), count(*) FILTER (WHERE kind = 'face-enroll' AND resolved IN ('committed-before', 'enrolled-now')) FROM privmatch_bench.outcomes")"
check() { # check WHAT CONDITION-OUTPUT
  if [ "$2" = ok ]; then checks+=("- ok: $1"); else checks+=("- **FAILED**: $1: $2"); fi
}
iris=() face=() prepared=()
for p in 0 1 2; do
  iris[p]=$(op_sql $p -c "SELECT count(*) FROM privmatch.iris_templates")
  face[p]=$(op_sql $p -c "SELECT count(*) FROM privmatch.face_templates")
  prepared[p]=$(op_sql $p -c "SELECT count(*) FROM pg_prepared_xacts")
done
read -r iris_enrolled face_enrolled <<<"$(app_sql -F ' ' -c "SELECT count(*) FILTER (WHERE kind = 'iris-enroll' AND answer = 'true'), count(*) FILTER (WHERE kind = 'face-enroll' AND answer = 'true') FROM privmatch_bench.outcomes")"
want_iris=$((iris_base + iris_enrolled + resolved_iris)) want_face=$((face_base + face_enrolled + resolved_face))
[ "${iris[*]}" = "$want_iris $want_iris $want_iris" ] && r=ok || r="P0..P2 hold ${iris[*]}, expected $want_iris each"
check "every iris enrolment at all three parties or none ($want_iris templates = $iris_base + $iris_enrolled enrolled + $resolved_iris of the failed calls, resolved)" "$r"
[ "${face[*]}" = "$want_face $want_face 0" ] && r=ok || r="P0..P2 hold ${face[*]}, expected $want_face $want_face 0"
check "every face enrolment at P0 and P1 or neither ($want_face = $face_base + $face_enrolled + $resolved_face resolved)" "$r"
[ -z "$resolutions" ] || checks+=("- failed enrolments called again: $resolutions")
[ "${prepared[*]}" = "0 0 0" ] && r=ok || r="prepared transactions: ${prepared[*]}"
check "no prepared transaction left at any party" "$r"
[ -z "$empty_levels" ] && r=ok || r="no outcome at$empty_levels"
check "every level recorded outcomes" "$r"
if [ "$link_delay_ms" != 0 ] && [[ ",$scripts," == *,iris-identify,* ]]; then
  # An identification takes at least 16 rounds, each a round trip on a delayed link: a p50
  # below that means the links were not delayed (noise only adds time).
  floor=$((16 * 2 * link_delay_ms))
  r=$(awk -v p="${identify_p50:-0}" -v f="$floor" 'BEGIN { print (p >= f ? "ok" : "p50 " p " ms") }')
  check "iris identifications crossed the delayed links (lowest p50 ${identify_p50:-none} ms ≥ 16 rounds × 2 × $link_delay_ms ms)" "$r"
fi
read -r used outcomes <<<"$(app_sql -F ' ' -c "SELECT (SELECT count(*) FROM privmatch_bench.inputs WHERE used), (SELECT count(*) FROM privmatch_bench.outcomes)")"
[ "$used" = "$outcomes" ] && r=ok || r="$used inputs taken, $outcomes outcomes"
check "each sealed input taken once, with one outcome ($outcomes)" "$r"

{
  echo "privmatch load test, $(date -u +%Y-%m-%dT%H:%MZ), target $target${fault:+, fault: $fault killed during the 4-client iris-enroll and iris-identify levels}, coordinator–party links $link_delay_ms ms one way, $duration s per level, base $iris_base iris templates (±$max_rotation rotations) and $face_base faces (dim 128)"
  echo "CPU: $cpu ($(nproc) cores; $features)"
  echo
  echo "| target | script | clients | TPS | p50 ms | p95 ms | p99 ms | ok | errors | batches: count, mean / max searches | transactions: pgbench = outcomes |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  printf '%s\n' "${checks[@]}"
} | tee ${report:+"$report"}
if printf '%s\n' "${checks[@]}" | grep -q FAILED; then exit 1; fi
