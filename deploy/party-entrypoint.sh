#!/usr/bin/env bash
# Entrypoint of a privmatch party container (deploy/Dockerfile, target party).
#
#   serve            initialise the party on first start, then run PostgreSQL (default)
#   health           healthy when PostgreSQL accepts connections and the party is initialised
#   identity         the party's identity (JSON): index, public key, fingerprint
#   pin PEER KEY     the operator pins peer PEER's public key (key ceremony)
#   psql [ARGS]      psql as the party's operator (the superuser: over the Unix socket,
#                    the only way it can log in)
#   front-door       install the SQL front door's credential and the coordinator's CA
#                    certificate (standard input: the credential on the first line, then the
#                    PEM); the key ceremony runs it
#
# Environment:
#   PRIVMATCH_PARTY_INDEX                 0, 1 or 2 (required)
#   PRIVMATCH_TLS_HOSTS                   names in the server certificate (default: the
#                                         container's host name, localhost)
#   PRIVMATCH_OPERATOR_PASSWORD_FILE      the operator role's password (default
#                                         /run/secrets/operator_password; generated if absent)
#   PRIVMATCH_COORDINATOR_PASSWORD_FILE   the password of the coordinator's login role
#                                         (default /run/secrets/coordinator_password; required)
#   PRIVMATCH_COORDINATOR_NETWORK         address range the coordinator connects from
#                                         (default: every address; TLS and password required;
#                                         docker-compose.yml: the coordinator's address)
#   PRIVMATCH_APPLICATION_NETWORK         address range applications connect from, if not
#                                         from inside the container (default: none; members
#                                         of privmatch_application only)
#   PRIVMATCH_COORDINATOR_URL             where the SQL front door reaches the coordinator
#                                         (default https://coordinator:8443; :8444, the
#                                         coordinator's delayed relay, when
#                                         PRIVMATCH_LINK_DELAY_MS is above 0)
#
# The volume /var/lib/privmatch holds everything the party keeps:
#   data/          the PostgreSQL data directory (templates, key material, journals)
#   party.key      the party's X25519 key (0600, owned by postgres), outside data/ so that a
#                  physical backup of data/ does not contain it
#   tls/           the party's own CA and server certificate (ca.pem is what the coordinator's
#                  operator pins)
#   operator/      the operator's configuration and Ed25519 signing key (in a deployment where
#                  the operator signs from elsewhere, move signing.key off this volume)
#   public/        identity.json and ca.pem: what this party's operator hands to the others
#   front-door/    the SQL front door's API credential (0600) and the coordinator's CA
set -euo pipefail

HOME_DIR=${PRIVMATCH_HOME:-/var/lib/privmatch}
DATA=$HOME_DIR/data
PG_BIN=/usr/lib/postgresql/15/bin
SOCKET_DIR=/var/run/postgresql
OPERATOR_CONFIG=$HOME_DIR/operator/operator.toml

as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

die() { echo "privmatch-party: $*" >&2; exit 1; }

party_index() {
  case "${PRIVMATCH_PARTY_INDEX:-}" in
    0 | 1 | 2) echo "$PRIVMATCH_PARTY_INDEX" ;;
    *) die "PRIVMATCH_PARTY_INDEX must be 0, 1 or 2 (got '${PRIVMATCH_PARTY_INDEX:-}')" ;;
  esac
}

# The operator's password: a provided secret, else one generated once and kept on the volume.
operator_password_file() {
  local given=${PRIVMATCH_OPERATOR_PASSWORD_FILE:-/run/secrets/operator_password}
  if [ -r "$given" ]; then
    echo "$given"
    return
  fi
  local kept=$HOME_DIR/operator/password
  if [ ! -s "$kept" ]; then
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$kept")
  fi
  echo "$kept"
}

coordinator_password_file() {
  local given=${PRIVMATCH_COORDINATOR_PASSWORD_FILE:-/run/secrets/coordinator_password}
  [ -r "$given" ] || die "no coordinator password: mount it at $given (a docker secret) or set PRIVMATCH_COORDINATOR_PASSWORD_FILE"
  echo "$given"
}

prepare_dirs() {
  mkdir -p "$HOME_DIR"/{operator,public,tls} "$SOCKET_DIR"
  chmod 0700 "$HOME_DIR/operator"
  chown postgres:postgres "$HOME_DIR" "$HOME_DIR/tls" "$SOCKET_DIR"
}

make_tls() {
  local hosts=${PRIVMATCH_TLS_HOSTS:-$(hostname),localhost}
  as_postgres privmatch operator tls --dir "$HOME_DIR/tls" --hosts "$hosts" >/dev/null
  cp "$HOME_DIR/tls/ca.pem" "$HOME_DIR/public/ca.pem"
}

initdb_once() {
  [ -s "$DATA/PG_VERSION" ] && return
  echo "privmatch-party: initdb (first start of P$(party_index))"
  local pwfile
  pwfile=$(mktemp)
  chown postgres "$pwfile"
  cat "$(operator_password_file)" >"$pwfile"
  as_postgres "$PG_BIN/initdb" -D "$DATA" -U privmatch --auth=scram-sha-256 \
    --pwfile "$pwfile" --no-locale -E UTF8 >/dev/null
  rm -f "$pwfile"
  cat >>"$DATA/postgresql.conf" <<EOF

# --- privmatch party ---
shared_preload_libraries = 'privmatch'
listen_addresses = '*'
port = 5432
unix_socket_directories = '$SOCKET_DIR'
max_prepared_transactions = 64
max_connections = 64
shared_buffers = 256MB
max_wal_size = 4GB
privmatch.key_file = '$HOME_DIR/party.key'
ssl = on
ssl_cert_file = '$HOME_DIR/tls/server.pem'
ssl_key_file = '$HOME_DIR/tls/server.key'
ssl_min_protocol_version = 'TLSv1.2'
EOF
}

# pg_hba.conf, rewritten on every start (so that a changed network, or a volume made by an
# older image, gets the rules below). The superuser `privmatch` (and any role that is a
# member of it, which could SET ROLE to it) logs in over the Unix socket only, never over
# TCP, whatever its password: a TCP line before the allowing ones rejects it, and no
# replication connection is accepted (none is used). Every other TCP login needs TLS and a
# password, and comes from the coordinator's address range, the container's own loopback
# (applications that use the front door from inside the container) or, if set, the
# application network (members of privmatch_application only).
write_hba() {
  local network=${PRIVMATCH_COORDINATOR_NETWORK:-all} applications=${PRIVMATCH_APPLICATION_NETWORK:-}
  case "$network$applications" in
    *[!0-9A-Za-z.:/-]*) die "PRIVMATCH_COORDINATOR_NETWORK, PRIVMATCH_APPLICATION_NETWORK: one address range, 'samenet' or 'all' each (got '$network', '$applications')" ;;
  esac
  {
    echo "# privmatch party: written by the entrypoint on every start (PRIVMATCH_COORDINATOR_NETWORK,"
    echo "# PRIVMATCH_APPLICATION_NETWORK); edits here are lost at the next start."
    echo "local     all         all                    scram-sha-256"
    echo "# The superuser and its members: the Unix socket only."
    echo "host      all         privmatch,+privmatch   all           reject"
    echo "host      replication all                    all           reject"
    echo "# Every other TCP login: TLS and a password, from the coordinator or loopback."
    echo "hostnossl all         all                    all           reject"
    echo "hostssl   all         all                    127.0.0.1/32  scram-sha-256"
    echo "hostssl   all         all                    ::1/128       scram-sha-256"
    echo "hostssl   all         all                    $network      scram-sha-256"
    if [ -n "$applications" ]; then
      echo "hostssl   all         +privmatch_application $applications scram-sha-256"
    fi
  } >"$DATA/pg_hba.conf.tmp"
  chown postgres: "$DATA/pg_hba.conf.tmp"
  chmod 0600 "$DATA/pg_hba.conf.tmp"
  mv "$DATA/pg_hba.conf.tmp" "$DATA/pg_hba.conf"
}

# First start: the operator's initialisation while PostgreSQL listens on its socket only.
initialise_once() {
  [ -s "$HOME_DIR/public/identity.json" ] && return
  echo "privmatch-party: initialising P$(party_index)"
  as_postgres "$PG_BIN/pg_ctl" start -w -t 300 -D "$DATA" -o "-c listen_addresses=''" \
    -l "$HOME_DIR/init.log" >/dev/null
  privmatch operator init --index "$(party_index)" --host "$SOCKET_DIR" \
    --password-file "$(operator_password_file)" \
    --coordinator-password-file "$(coordinator_password_file)" \
    --signing-key "$HOME_DIR/operator/signing.key" --config "$OPERATOR_CONFIG" \
    >"$HOME_DIR/public/identity.json.tmp"
  as_postgres "$PG_BIN/pg_ctl" stop -w -m fast -D "$DATA" >/dev/null
  mv "$HOME_DIR/public/identity.json.tmp" "$HOME_DIR/public/identity.json"
  echo "privmatch-party: P$(party_index) initialised: $(cat "$HOME_DIR/public/identity.json")"
}

# The SQL front door's settings (docs/front-door.md), rewritten on every start so that a
# changed PRIVMATCH_COORDINATOR_URL applies; postgresql.conf includes the file.
front_door_settings() {
  # With PRIVMATCH_LINK_DELAY_MS, the coordinator's container relays the API on 8444 with that
  # delay (deploy/coordinator-entrypoint.sh).
  local api_port=8443
  [ "${PRIVMATCH_LINK_DELAY_MS:-0}" = 0 ] || api_port=8444
  cat >"$DATA/privmatch-front-door.conf" <<EOF
# written by the privmatch party entrypoint on every start
privmatch.coordinator_url = '${PRIVMATCH_COORDINATOR_URL:-https://coordinator:$api_port}'
privmatch.coordinator_ca_file = '$HOME_DIR/front-door/coordinator-ca.pem'
privmatch.coordinator_credential_file = '$HOME_DIR/front-door/credential'
EOF
  chown postgres: "$DATA/privmatch-front-door.conf"
  grep -q "^include_if_exists = 'privmatch-front-door.conf'" "$DATA/postgresql.conf" ||
    echo "include_if_exists = 'privmatch-front-door.conf'" >>"$DATA/postgresql.conf"
}

# `front-door`: the credential (first line of standard input) and the coordinator's CA
# certificate (the rest), written for the server's user only; read at each front-door call.
install_front_door() {
  local dir=$HOME_DIR/front-door credential
  mkdir -p "$dir"
  IFS= read -r credential
  [ -n "$credential" ] || die "front-door: no credential on the first line of standard input"
  (umask 077 && printf '%s\n' "$credential" >"$dir/credential.tmp" && cat >"$dir/coordinator-ca.pem.tmp")
  grep -q "BEGIN CERTIFICATE" "$dir/coordinator-ca.pem.tmp" || die "front-door: no PEM certificate after the credential"
  chmod 0644 "$dir/coordinator-ca.pem.tmp"
  chown -R postgres: "$dir"
  chmod 0700 "$dir"
  mv "$dir/credential.tmp" "$dir/credential"
  mv "$dir/coordinator-ca.pem.tmp" "$dir/coordinator-ca.pem"
  echo "privmatch-party: P$(party_index)'s SQL front door is configured"
}

serve() {
  party_index >/dev/null
  prepare_dirs
  make_tls
  initdb_once
  write_hba
  initialise_once
  front_door_settings
  echo "privmatch-party: P$(party_index) serving: $(cat "$HOME_DIR/public/identity.json")"
  exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$PG_BIN/postgres" -D "$DATA"
}

case "${1:-serve}" in
  serve) serve ;;
  health)
    [ -s "$HOME_DIR/public/identity.json" ] || exit 1
    "$PG_BIN/pg_isready" -q -h "$SOCKET_DIR" -p 5432
    ;;
  identity) cat "$HOME_DIR/public/identity.json" ;;
  pin)
    [ $# -ge 3 ] || die "usage: pin PEER_INDEX PUBLIC_KEY [--replace]"
    shift
    peer=$1 key=$2
    shift 2
    privmatch operator pin --config "$OPERATOR_CONFIG" --peer "$peer" --key "$key" "$@"
    ;;
  front-door) install_front_door ;;
  psql)
    shift
    PGPASSWORD=$(cat "$(operator_password_file)") exec psql -h "$SOCKET_DIR" -U privmatch -d privmatch "$@"
    ;;
  *) exec "$@" ;;
esac
