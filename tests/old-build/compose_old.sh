#!/bin/bash
# Attack 8 (compose) against the OLD build f21d1f1: in the old docker compose deployment, one
# party reaches another's PostgreSQL, and the superuser logs in over TCP from the coordinator's
# container with its password. Refused now by deploy/smoke.sh (step "each party on its own
# network with the coordinator"). Needs the old build of README.md here; runs in its own
# compose project (privmatch-old), removed afterwards. Prints ATTACK lines.
set -u
OLD_TREE=${OLD_TREE:-/work/old}
PGOLD=${PGOLD:-/work/pgold}
export PATH=$PGOLD/lib/postgresql/15/bin:$PATH PGRX_HOME=$PGOLD/pgrx-home
export CARGO_TARGET_DIR=${OLD_TARGET:-/work/old-target}
export PG_CONFIG=$PGOLD/lib/postgresql/15/bin/pg_config
export COMPOSE_PROJECT_NAME=privmatch-old PRIVMATCH_API_PORT=18643
work=$(mktemp -d /tmp/privmatch-old-compose.XXXXXX)
export PRIVMATCH_SECRETS_DIR=$work/secrets PRIVMATCH_CLIENT_DIR=$work/client
cd "$OLD_TREE" || exit 1
tag=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
compose() { docker-compose "$@"; }
cleanup() { compose down -v >/dev/null 2>&1; rm -rf "$work"; }
trap cleanup EXIT
PRIVMATCH_LOCAL_BASE=1 bash deploy/images.sh --prebuilt || exit 1
bash deploy/secrets.sh >/dev/null || exit 1
compose up -d || exit 1
for _ in $(seq 150); do
  [ "$(compose ps | grep -c '(healthy)')" = 4 ] && break
  sleep 2
done
compose ps
out=$(compose exec -T -e PGCONNECT_TIMEOUT=5 p0 psql "host=p1 dbname=privmatch user=coordinator password=x sslmode=require" -Atc "SELECT 1" 2>&1)
echo "P0 -> P1's PostgreSQL: $out"
if echo "$out" | grep -q FATAL; then
  echo "ATTACK compose-party-reaches-party: SUCCEEDED (P1's PostgreSQL answered a connection from P0's container: $(echo "$out" | grep -m1 FATAL))"
else
  echo "ATTACK compose-party-reaches-party: REFUSED ($out)"
fi
pw=$(compose exec -T p0 cat /var/lib/privmatch/operator/password)
coordinator=$(compose ps -q coordinator)
out=$(docker run --rm --network "container:$coordinator" --entrypoint psql -e PGCONNECT_TIMEOUT=5 \
  "privmatch/party:$tag" "host=p0 dbname=privmatch user=privmatch password=$pw sslmode=require" \
  -Atc "SELECT current_user || ' superuser=' || rolsuper FROM pg_roles WHERE rolname = current_user" 2>&1)
echo "the superuser over TCP from the coordinator's container: $out"
if echo "$out" | grep -q "superuser=true"; then
  echo "ATTACK compose-superuser-over-tcp: SUCCEEDED ($out)"
else
  echo "ATTACK compose-superuser-over-tcp: REFUSED ($out)"
fi
