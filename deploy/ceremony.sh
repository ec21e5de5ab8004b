#!/usr/bin/env bash
# The key ceremony of the docker compose deployment, all on this host (README, "Deploy with
# docker compose", says who does which step when the parties are three organisations):
#   1. each party initialised itself on first start and made its key inside itself;
#   2. its identity (public key, fingerprint) and TLS CA certificate are read out;
#   3. each operator pins the two peers' keys at its own party;
#   4. the identities and CA certificates are handed to the coordinator, which then starts;
#   5. a client credential is issued: deploy/client/privmatch.toml (with the coordinator's CA
#      certificate beside it), for `privmatch --config deploy/client/privmatch.toml …`
#      (PRIVMATCH_CLIENT_DIR: elsewhere). It holds the coordinator's URL, CA and the credential
#      only, never a party key: the coordinator is not trusted with the parties' identities;
#   6. each party's operator exports the party's signed identity bundle and reads out its
#      fingerprint; the client pins each bundle with that fingerprint (`privmatch client pin`,
#      run here on the host with the client's CLI: PRIVMATCH_BIN, else
#      target/release/privmatch, else `privmatch` on PATH). On one host the fingerprint travels from the party's
#      output to the client's command line; between organisations it goes by a second channel;
#   7. each party's SQL front door gets its own API credential (enroll, search) and the
#      coordinator's CA certificate.
# Safe to run again: pins of the same keys and the handover are idempotent; an existing client
# configuration is kept (a party whose identity changed is refused by `client pin`).
set -euo pipefail
cd "$(dirname "$0")/.."

compose() {
  if docker compose version >/dev/null 2>&1; then docker compose "$@"; else docker-compose "$@"; fi
}

wait_healthy() {
  local service=$1 probe=$2 deadline=$((SECONDS + ${PRIVMATCH_WAIT:-600}))
  until compose exec -T "$service" "$probe" health >/dev/null 2>&1; do
    if [ $SECONDS -gt $deadline ]; then
      echo "ceremony: $service is not healthy; see: docker compose logs $service" >&2
      exit 1
    fi
    sleep 2
  done
}

declare -a keys
for i in 0 1 2; do
  wait_healthy "p$i" privmatch-party
  identity=$(compose exec -T "p$i" privmatch-party identity)
  keys[i]=$(echo "$identity" | sed -n 's/.*"public_key":"\([0-9a-f]*\)".*/\1/p')
  fingerprint=$(echo "$identity" | sed -n 's/.*"fingerprint":"\([0-9a-f]*\)".*/\1/p')
  [ ${#keys[i]} = 64 ] || { echo "ceremony: P$i's identity is unreadable: $identity" >&2; exit 1; }
  echo "P$i  key fingerprint $fingerprint"
done
for i in 0 1 2; do
  for j in 0 1 2; do
    [ "$i" = "$j" ] && continue
    compose exec -T "p$i" privmatch-party pin "$j" "${keys[j]}"
  done
done
for i in 0 1 2; do
  dir=/var/lib/privmatch/handover/p$i
  compose exec -T "p$i" privmatch-party identity |
    compose exec -T coordinator sh -c "mkdir -p $dir && cat > $dir/identity.json"
  compose exec -T "p$i" cat /var/lib/privmatch/public/ca.pem |
    compose exec -T coordinator sh -c "cat > $dir/ca.pem"
done
echo "ceremony: handed the identities and CA certificates to the coordinator"
wait_healthy coordinator privmatch-coordinator
client=${PRIVMATCH_CLIENT_DIR:-deploy/client}
if [ ! -s "$client/privmatch.toml" ]; then
  name=client-$(date +%s)
  compose exec -T coordinator privmatch-coordinator credential --name "$name" \
    --scopes enroll,search,delete,admin \
    --client-config "/var/lib/privmatch/clients/$name/privmatch.toml" \
    --url "https://localhost:${PRIVMATCH_API_PORT:-8443}" >/dev/null
  mkdir -p "$client"
  chmod 0700 "$client"
  for f in privmatch.toml coordinator-ca.pem; do
    compose exec -T coordinator cat "/var/lib/privmatch/clients/$name/$f" >"$client/$f"
  done
  chmod 0600 "$client/privmatch.toml"
  compose exec -T coordinator rm -rf "/var/lib/privmatch/clients/$name"
  compose restart coordinator >/dev/null
  wait_healthy coordinator privmatch-coordinator
fi
# 6. the parties' identities reach the client from their operators, never from the
#    coordinator: each operator exports a signed bundle and its fingerprint; the client pins
#    the bundle only if the fingerprint matches.
client_cli=${PRIVMATCH_BIN:-target/release/privmatch}
[ -x "$client_cli" ] || client_cli=$(command -v privmatch || true)
[ -x "$client_cli" ] || {
  echo "ceremony: the client's privmatch CLI is needed on this host to pin the parties' identities (set PRIVMATCH_BIN)" >&2
  exit 1
}
for i in 0 1 2; do
  exported=$(compose exec -T "p$i" privmatch party identity-export \
    --operator-config /var/lib/privmatch/operator/operator.toml \
    --tls-ca /var/lib/privmatch/public/ca.pem \
    --out /var/lib/privmatch/public/identity.bundle.json | tr -d '\r')
  fingerprint=$(echo "$exported" | sed -n 's/.*identity fingerprint \([0-9a-f]*\).*/\1/p')
  [ ${#fingerprint} = 32 ] || { echo "ceremony: P$i's identity export failed: $exported" >&2; exit 1; }
  echo "P$i  identity fingerprint $fingerprint"
  compose exec -T "p$i" cat /var/lib/privmatch/public/identity.bundle.json >"$client/p$i.identity.json"
  "$client_cli" --config "$client/privmatch.toml" client pin \
    --bundle "$client/p$i.identity.json" --fingerprint "$fingerprint" >/dev/null
done
echo "ceremony: the client pinned the three parties' identity bundles"
# 7. each party's SQL front door gets its own credential (scopes enroll and search) and the
#    coordinator's CA certificate; the coordinator restarts to accept the new credentials.
doors=0
for i in 0 1 2; do
  if compose exec -T "p$i" test -s /var/lib/privmatch/front-door/credential; then continue; fi
  token=$(compose exec -T coordinator privmatch-coordinator credential \
    --name "front-door-p$i-$(date +%s)" --scopes enroll,search | tr -d '\r' | tail -n 1)
  { echo "$token"; compose exec -T coordinator cat /var/lib/privmatch/tls/ca.pem; } |
    compose exec -T "p$i" privmatch-party front-door
  doors=$((doors + 1))
done
if [ "$doors" -gt 0 ]; then
  compose restart coordinator >/dev/null
  wait_healthy coordinator privmatch-coordinator
fi
echo "ceremony: done; client configuration $client/privmatch.toml"
