#!/usr/bin/env bash
# Entrypoint of the privmatch coordinator container (deploy/Dockerfile, target coordinator).
#
#   serve        wait for the key ceremony's handover, (re)write the configuration, serve the
#                API over TLS as the unprivileged user privmatch (default)
#   health       healthy when the API port accepts connections
#   credential   privmatch coordinator credential … (prints the token once; restart after)
#
# Environment:
#   PRIVMATCH_PARTIES     HOST:PORT of P0,P1,P2 (default p0:5432,p1:5432,p2:5432)
#   PRIVMATCH_TLS_HOSTS   names in the API's certificate (default: host name,localhost,127.0.0.1)
#   PRIVMATCH_SECRETS     directory of p<i>_coordinator_password (default /run/secrets)
#   PRIVMATCH_LINK_DELAY_MS  one-way delay in ms on every coordinator–party link (default 0:
#                         none). Above 0, a relay in this container (`privmatch cluster
#                         delay-proxy`, log in the volume's delay-proxy.log) holds every byte
#                         that long each way: the coordinator reaches party i through
#                         localhost:1543<i> (the parties' certificates name localhost), and the
#                         parties' front doors call the API on port 8444 (their entrypoint
#                         reads the same variable). For load runs as if the organisations ran
#                         on hosts apart (tests/pgbench/load.sh --target compose
#                         --link-delay-ms); a TLS link's bytes are all the relay sees.
#
# The volume /var/lib/privmatch holds: coordinator.toml (0600), tls/ (the API's own CA and
# certificate; tls/ca.pem is what clients pin), api-keys.toml (digests of the credentials),
# handover/p<i>/{identity.json,ca.pem} (what each party's operator handed over).
set -euo pipefail

HOME_DIR=${PRIVMATCH_HOME:-/var/lib/privmatch}
HANDOVER=$HOME_DIR/handover

handover_complete() {
  for i in 0 1 2; do
    [ -s "$HANDOVER/p$i/identity.json" ] && [ -s "$HANDOVER/p$i/ca.pem" ] || return 1
  done
}

# start_delay_relay PARTIES MS: starts the relay (PRIVMATCH_LINK_DELAY_MS above) as the
# unprivileged user and prints the parties' delayed addresses, in PARTIES' order.
start_delay_relay() {
  local parties=$1 delay=$2 links=() relayed=() i=0 target
  for target in ${parties//,/ }; do
    links+=(--link "127.0.0.1:$((15430 + i))=$target")
    relayed+=("localhost:$((15430 + i))")
    i=$((i + 1))
  done
  # The front doors' calls to the API: on every network of this container, port 8444.
  links+=(--link "0.0.0.0:8444=127.0.0.1:8443")
  touch "$HOME_DIR/delay-proxy.log"
  chown privmatch:privmatch "$HOME_DIR/delay-proxy.log"
  setpriv --reuid=privmatch --regid=privmatch --init-groups -- \
    privmatch cluster delay-proxy --one-way-ms "$delay" "${links[@]}" >>"$HOME_DIR/delay-proxy.log" 2>&1 &
  echo "privmatch-coordinator: every link to a party delayed by $delay ms each way (pid $!)" >&2
  (IFS=,; echo "${relayed[*]}")
}

serve() {
  mkdir -p "$HANDOVER"
  local waited=0
  until handover_complete; do
    if [ $((waited % 30)) = 0 ]; then
      echo "privmatch-coordinator: waiting for the key ceremony: $HANDOVER/p<i>/identity.json and ca.pem for P0, P1, P2 (deploy/ceremony.sh)"
    fi
    sleep 2
    waited=$((waited + 2))
  done
  local parties=${PRIVMATCH_PARTIES:-p0:5432,p1:5432,p2:5432}
  case ${PRIVMATCH_LINK_DELAY_MS:-0} in
    '' | *[!0-9]*)
      echo "privmatch-coordinator: PRIVMATCH_LINK_DELAY_MS is a whole number of milliseconds, not '$PRIVMATCH_LINK_DELAY_MS'" >&2
      exit 2
      ;;
  esac
  if [ "${PRIVMATCH_LINK_DELAY_MS:-0}" != 0 ]; then
    parties=$(start_delay_relay "$parties" "$PRIVMATCH_LINK_DELAY_MS")
  fi
  privmatch --home "$HOME_DIR" coordinator init \
    --parties "$parties" \
    --tls-hosts "${PRIVMATCH_TLS_HOSTS:-$(hostname),localhost,127.0.0.1}" \
    --handover "$HANDOVER" --secrets "${PRIVMATCH_SECRETS:-/run/secrets}"
  chown -R privmatch:privmatch "$HOME_DIR"
  exec setpriv --reuid=privmatch --regid=privmatch --init-groups -- \
    privmatch --home "$HOME_DIR" coordinator serve
}

case "${1:-serve}" in
  serve) serve ;;
  health) exec 3<>/dev/tcp/127.0.0.1/8443 ;;
  credential)
    shift
    privmatch --home "$HOME_DIR" coordinator credential "$@"
    chown -R privmatch:privmatch "$HOME_DIR"
    ;;
  *) exec "$@" ;;
esac
