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
  privmatch --home "$HOME_DIR" coordinator init \
    --parties "${PRIVMATCH_PARTIES:-p0:5432,p1:5432,p2:5432}" \
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
