#!/usr/bin/env bash
# End-to-end check of the docker compose deployment on this host, in its own compose project
# (privmatch-smoke), secrets and client directory, removed afterwards:
#   images from this host's binaries (deploy/images.sh --prebuilt, on local base images unless
#   PRIVMATCH_LOCAL_BASE=0), `up`, the key ceremony, 1,000 iris templates and 1,000 faces
#   enrolled through the coordinator, searches and identifications checked against what the
#   synthetic data implies, the SQL front door (an application role enrols, identifies and
#   verifies with SQL and can read no table), each party on a network of its own with the
#   coordinator (unreachable from the api network and from the other parties, refusing
#   connections without TLS, with a wrong password or from another address than the
#   coordinator's, and its superuser over TCP even with its password), the coordinator killed
#   during an enrolment (the front door names it while it is down; after its restart no
#   transaction is left prepared
#   and the three parties hold the same records), a party killed mid-search (a clear error,
#   nothing left prepared, the next search works), `down` then `up` (the data is kept).
# Prints SKIP and succeeds where Docker is not available. Needs scripts/setup.sh first.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
# The images are tagged with the workspace version (deploy/images.sh); compose and the probes
# below use the same tag, so a version bump cannot leave them asking for an image not built.
export PRIVMATCH_TAG=${PRIVMATCH_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)}

if ! docker info >/dev/null 2>&1; then
  echo "SKIP deploy/smoke.sh: Docker is not available here"
  exit 0
fi
compose() {
  if docker compose version >/dev/null 2>&1; then
    (cd "$REPO" && docker compose "$@")
  else
    (cd "$REPO" && docker-compose "$@")
  fi
}
export COMPOSE_PROJECT_NAME=${COMPOSE_PROJECT_NAME:-privmatch-smoke}
export PRIVMATCH_API_PORT=${PRIVMATCH_API_PORT:-18443}
work=$(mktemp -d /tmp/privmatch-smoke.XXXXXX)
export PRIVMATCH_SECRETS_DIR=$work/secrets PRIVMATCH_CLIENT_DIR=$work/client
cleanup() {
  compose down -v >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
P=${PRIVMATCH_BIN:-$REPO/target/release/privmatch}
C=(--config "$work/client/privmatch.toml")
fail() { echo "FAIL deploy/smoke.sh: $*" >&2; exit 1; }

step() { echo "==> smoke: $*"; }
wait_all_healthy() {
  for _ in $(seq 150); do
    [ "$(compose ps | grep -c '(healthy)')" = 4 ] && return
    sleep 2
  done
  compose ps
  fail "not every service became healthy"
}

step "images (prebuilt)"
PRIVMATCH_LOCAL_BASE=${PRIVMATCH_LOCAL_BASE:-1} bash deploy/images.sh --prebuilt
step "up and key ceremony"
compose down -v >/dev/null 2>&1 || true
bash deploy/secrets.sh >/dev/null
compose up -d
bash deploy/ceremony.sh
wait_all_healthy

cd "$work"
step "iris: enrol 1,000 (20 with a near-duplicate) and search 40"
"$P" iris synth 1000 --near-duplicates 20 -o iris.ndjson
"$P" "${C[@]}" iris enroll --input iris.ndjson
head -40 iris.ndjson >probes.ndjson
"$P" "${C[@]}" iris search --input probes.ndjson >search.out
# Probe i is enrolled template i: it matches itself, and its near-duplicate for i < 20.
for i in $(seq 0 39); do
  subject=$(printf 'synth-%07d' "$i")
  if [ "$i" -lt 20 ]; then
    want="probe $i (line $((i + 1))): 2 matches: $subject (left), $subject-near (left)"
  else
    want="probe $i (line $((i + 1))): 1 match: $subject (left)"
  fi
  grep -qxF "$want" search.out || fail "iris search: expected '$want' in $(pwd)/search.out"
done

step "faces: configure, enrol 1,000, identify 20, verify 2"
compose exec -T p2 cat /var/lib/privmatch/operator/signing.key >p2.key
chmod 0600 p2.key
"$P" "${C[@]}" face configure --metric cosine --threshold 0.7 --dim 128 --operator-key p2.key >/dev/null
"$P" face synth --subjects 1000 --dim 128 --out faces.ndjson --probes face-probes.ndjson
"$P" "${C[@]}" face enroll --input faces.ndjson
# The first identification opens the 1,000 templates once; P2 deals each session's keys.
head -20 face-probes.ndjson >fp.ndjson
"$P" "${C[@]}" face identify --input fp.ndjson >identify.out
for i in $(seq 0 19); do
  want=$(printf '{"probe":%d,"matches":["face-%07d"]}' "$i" "$i")
  grep -qxF "$want" identify.out || fail "face identify: expected $want"
done
"$P" "${C[@]}" face verify --subject face-0000007 --input <(sed -n 8p face-probes.ndjson) >verify.out
grep -q '"match":true' verify.out || fail "face verify of face-0000007: $(cat verify.out)"
"$P" "${C[@]}" face verify --subject face-0000008 --input <(sed -n 8p face-probes.ndjson) >verify.out
grep -q '"match":false' verify.out || fail "face verify of another subject: $(cat verify.out)"

step "SQL front door at P0: an application enrols and matches with SQL"
app_password=$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
compose exec -T p0 privmatch-party psql -q -v ON_ERROR_STOP=1 \
  -c "CREATE ROLE smoke_app LOGIN PASSWORD '$app_password' IN ROLE privmatch_application" \
  -c "SELECT count(*) FROM privmatch.apply_login_limits()" >/dev/null
app_sql() { # app_sql SQL: runs SQL (read from standard input: sealed inputs make it long) as
  # smoke_app at P0 over TLS
  printf '%s\n' "$1" | compose exec -T -e PGPASSWORD="$app_password" -e PGSSLMODE=require p0 \
    psql -h 127.0.0.1 -U smoke_app -d privmatch -Atq -v ON_ERROR_STOP=1 -f -
}
tsv_values() { # tsv_values FILE: the lines "subject<TAB>sealed" as a VALUES list (the application
  # may create no table, not even a TEMP one; sealed inputs are base64, subjects plain names)
  awk -F'\t' '{ printf "%s(\x27%s\x27, \x27%s\x27)", (NR > 1 ? ", " : ""), $1, $2 }' "$1"
}
# New templates (another seed), so that the searches below still find what they found before.
"$P" iris synth 5 --seed 99 | sed 's/"synth-/"sql-/' >sql-enrol.ndjson
"$P" "${C[@]}" iris seal --for enroll --input sql-enrol.ndjson --out sql-enrol.tsv 2>/dev/null
"$P" "${C[@]}" iris seal --for identify --front-door 0 --input <(head -3 sql-enrol.ndjson) --out sql-probes.tsv 2>/dev/null
"$P" "${C[@]}" face seal --for verify --front-door 0 --input <(sed -n 8p faces.ndjson) --out sql-verify.tsv 2>/dev/null
enrolled=$(app_sql "SELECT count(*) FILTER (WHERE privmatch.iris_enroll(sealed)) FROM (VALUES $(tsv_values sql-enrol.tsv)) s (subject, sealed)")
[ "$enrolled" = 5 ] || fail "front door: enrolled $enrolled of 5"
matches=$(app_sql "SELECT string_agg(m.subject, ',' ORDER BY m.subject) FROM (VALUES $(tsv_values sql-probes.tsv)) s (subject, sealed), privmatch.iris_identify(s.sealed) m")
want="sql-0000000,sql-0000001,sql-0000002"
[ "$matches" = "$want" ] || fail "front door identify: got $matches, want $want"
verified=$(app_sql "SELECT privmatch.face_verify(subject, sealed) FROM (VALUES $(tsv_values sql-verify.tsv)) s (subject, sealed)")
[ "$verified" = t ] || fail "front door face_verify: $verified"
denied=$(app_sql "SELECT count(*) FROM privmatch.iris_templates" 2>&1 || true)
echo "$denied" | grep -q "permission denied" || fail "the application role read the templates: $denied"
temp=$(app_sql "CREATE TEMP TABLE s (x int)" 2>&1 || true)
echo "$temp" | grep -q "permission denied" || fail "the application role created a TEMP table: $temp"
echo "    enrolled 5 and identified 3 probes with SQL; the application role cannot read a table or create a TEMP one"

step "each party on its own network with the coordinator: no party reaches another, TLS, a password and the coordinator's address required, the superuser never over TCP"
image=privmatch/party:$PRIVMATCH_TAG
coordinator=$(compose ps -q coordinator)
unreachable="could not translate host name|timeout expired|could not connect|Network is unreachable|No route to host|Connection refused"
psql_at() { # psql_at NETWORK CONNINFO: psql from a throwaway container on NETWORK (a compose
  # network's name, or container:ID to share that container's addresses); its output or error
  local network=$1
  case $network in container:*) ;; *) network=${COMPOSE_PROJECT_NAME}_$network ;; esac
  docker run --rm --network "$network" --entrypoint psql -e PGCONNECT_TIMEOUT=5 \
    "$image" "$2" -Atc "SELECT 1" 2>&1 || true
}
from_party() { # from_party I CONNINFO: psql inside party I's own container; its output or error
  compose exec -T -e PGCONNECT_TIMEOUT=5 "p$1" psql "$2" -Atc "SELECT 1" 2>&1 || true
}
is_unreachable() { # is_unreachable OUTPUT: no server answered (no FATAL from PostgreSQL either)
  echo "$1" | grep -qE "$unreachable" && ! echo "$1" | grep -q "FATAL"
}
out=$(psql_at api "host=p0 dbname=privmatch user=privmatch sslmode=require")
is_unreachable "$out" || fail "P0 answered on the api network: $out"
declare -a address
for j in 0 1 2; do
  address[j]=$(docker inspect -f "{{with index .NetworkSettings.Networks \"${COMPOSE_PROJECT_NAME}_p$j\"}}{{.IPAddress}}{{end}}" "$(compose ps -q "p$j")")
  [ -n "${address[j]}" ] || fail "P$j has no address on its network p$j"
done
# No party reaches another's PostgreSQL, by name or by address.
for pair in 0:1 0:2 1:2 2:0; do
  i=${pair%:*} j=${pair#*:}
  for host in "p$j" "${address[j]}"; do
    out=$(from_party "$i" "host=$host dbname=privmatch user=coordinator password=x sslmode=require")
    is_unreachable "$out" || fail "P$i reached P$j's PostgreSQL at $host: $out"
  done
done
# The superuser is the only role with its rights: no other superuser, no member that could
# SET ROLE to it (pg_hba.conf refuses privmatch and its members over TCP).
for i in 0 1 2; do
  supers=$(compose exec -T "p$i" privmatch-party psql -Atc "SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles WHERE rolsuper OR pg_has_role(oid, 'privmatch', 'MEMBER')")
  [ "$supers" = privmatch ] || fail "P$i: roles with the superuser's rights: $supers"
done
# From the coordinator's own addresses: its login works with TLS and its password only; the
# superuser is refused with its right password.
coordinator_password=$(cat "$PRIVMATCH_SECRETS_DIR/p0_coordinator_password")
superuser_password=$(compose exec -T p0 cat /var/lib/privmatch/operator/password)
[ -n "$superuser_password" ] || fail "P0's superuser password is unreadable"
out=$(psql_at "container:$coordinator" "host=${address[0]} dbname=privmatch user=coordinator password=$coordinator_password sslmode=require")
[ "$out" = 1 ] || fail "the coordinator's login from the coordinator's address: $out"
out=$(psql_at "container:$coordinator" "host=${address[0]} dbname=privmatch user=privmatch password=$superuser_password sslmode=require")
echo "$out" | grep -q 'pg_hba.conf rejects connection for host .*user "privmatch"' ||
  fail "P0's superuser logged in over TCP from the coordinator's address: $out"
out=$(from_party 0 "host=127.0.0.1 dbname=privmatch user=privmatch password=$superuser_password sslmode=require")
echo "$out" | grep -q 'pg_hba.conf rejects connection for host .*user "privmatch"' ||
  fail "P0's superuser logged in over TCP inside its container: $out"
out=$(psql_at "container:$coordinator" "host=${address[0]} dbname=privmatch user=coordinator password=$coordinator_password sslmode=disable")
echo "$out" | grep -q "pg_hba.conf rejects connection" || fail "P0 accepted a connection without TLS: $out"
out=$(psql_at "container:$coordinator" "host=${address[0]} dbname=privmatch user=coordinator password=wrong sslmode=require")
echo "$out" | grep -q "password authentication failed" || fail "P0 accepted a wrong password: $out"
# Another address on P0's network, with the coordinator's right password: not the coordinator.
out=$(psql_at p0 "host=p0 dbname=privmatch user=coordinator password=$coordinator_password sslmode=require")
echo "$out" | grep -q "no pg_hba.conf entry for host" || fail "P0 accepted the coordinator's login from another address: $out"
# The coordinator still works through the new networks (the front door above used them too).
"$P" "${C[@]}" iris search --input probes.ndjson | cmp -s - search.out || fail "search after the network checks differs"
echo "    api network: no route to P0; P0, P1, P2: no route to each other (by name or address)"
echo "    from the coordinator's address: its login works; the superuser, no TLS, a wrong password: refused"
echo "    the superuser over TCP inside P0: refused; the coordinator's password from another address on p0: refused"

step "the coordinator killed during an enrolment, and while the front door is used"
"$P" iris synth 3000 --seed 7 | sed 's/"synth-/"more-/' >more.ndjson
set +e
# Small batches one at a time (about 500 records/s here), so that the kill lands mid-run.
"$P" "${C[@]}" iris enroll --input more.ndjson --batch-size 5 --parallel 1 --no-progress >kill-enrol.out 2>kill-enrol.err &
enrol=$!
sleep 2
docker kill "$(compose ps -q coordinator)" >/dev/null
wait $enrol
rc=$?
# A real sealed probe (the front door opens and checks it before it calls the coordinator).
down=$(app_sql "SELECT count(*) FROM privmatch.iris_identify('$(head -1 sql-probes.tsv | cut -f2)')" 2>&1)
set -e
[ $rc != 0 ] || fail "the enrolment went on with the coordinator killed"
echo "$down" | grep -q "cannot reach the coordinator at https://coordinator:8443" ||
  fail "front door with the coordinator down: $down"
echo "    enrolment: $(tail -1 kill-enrol.err)"
echo "    front door: $(echo "$down" | head -1)"
compose start coordinator >/dev/null
wait_all_healthy
"$P" "${C[@]}" recover >/dev/null
"$P" "${C[@]}" iris enroll --input more.ndjson --no-progress >/dev/null
for i in 0 1 2; do
  prepared=$(compose exec -T "p$i" privmatch-party psql -Atc "SELECT count(*) FROM pg_prepared_xacts")
  [ "$prepared" = 0 ] || fail "P$i holds $prepared prepared transaction(s) after the coordinator's restart"
  counts[i]=$(compose exec -T "p$i" privmatch-party psql -Atc "SELECT count(*) FROM privmatch.iris_templates")
done
[ "${counts[0]}" = 4025 ] && [ "${counts[1]}" = 4025 ] && [ "${counts[2]}" = 4025 ] ||
  fail "after the coordinator's restart the parties hold ${counts[*]} iris templates, not 4025 each"

step "a party killed mid-search"
head -300 iris.ndjson >many.ndjson
set +e
"$P" "${C[@]}" iris search --input many.ndjson >killed.out 2>killed.err &
search=$!
sleep 3
docker kill "$(compose ps -q p1)" >/dev/null
wait $search
rc=$?
set -e
[ $rc != 0 ] || fail "the search went on with P1 killed"
grep -q "P1" killed.err || fail "the error does not name P1: $(cat killed.err)"
echo "    error while P1 was down: $(tail -1 killed.err)"
compose start p1 >/dev/null
wait_all_healthy
for i in 0 1 2; do
  prepared=$(compose exec -T "p$i" privmatch-party psql -Atc "SELECT count(*) FROM pg_prepared_xacts")
  [ "$prepared" = 0 ] || fail "P$i holds $prepared prepared transaction(s)"
done
"$P" "${C[@]}" iris search --input probes.ndjson | cmp -s - search.out || fail "search after P1's restart differs"

step "down, then up: the data is kept"
compose down >/dev/null
compose up -d >/dev/null
wait_all_healthy
"$P" "${C[@]}" iris search --input probes.ndjson | cmp -s - search.out || fail "search after down/up differs"
head -5 fp.ndjson >fp5.ndjson
"$P" "${C[@]}" face identify --input fp5.ndjson | grep '^{' | cmp -s - <(head -5 identify.out) ||
  fail "identify after down/up differs"
step "ok"
