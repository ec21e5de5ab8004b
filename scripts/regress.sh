#!/usr/bin/env bash
# Runs the privmatch extension's SQL regression tests (extension/tests: sql/, expected/ and
# schedule) with pg_regress, against a throwaway PostgreSQL 15 cluster that this script creates
# in a mktemp directory, listening on 127.0.0.1:${PRIVMATCH_REGRESS_PORT:-17100} and owned by an
# unprivileged user (postgres when run as root, otherwise the current user). The cluster is
# always stopped and removed at the end. Exit status: 0 all passed, 1 a test failed, 2 the
# tests could not run.
#
# The extension must already be installed (scripts/setup.sh does that; after changing it:
# cd extension && cargo pgrx install --release --pg-config /usr/lib/postgresql/15/bin/pg_config).
#
# Usage: scripts/regress.sh [TEST...]   (default: every test, in the order of the schedule)
# Environment:
#   PRIVMATCH_REGRESS_PORT=N   port of the throwaway cluster (default 17100)
#   PRIVMATCH_REGRESS_KEEP=1   keep the temporary directory (results/*.out, server log)
#   PG_CONFIG=PATH             pg_config of the PostgreSQL to test against (default: 15)
# To accept a deliberate change of output: run with PRIVMATCH_REGRESS_KEEP=1, review the diff,
# then copy <tmp>/out/results/<test>.out over extension/tests/expected/<test>.out.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
PORT=${PRIVMATCH_REGRESS_PORT:-17100}

die() {
  echo "regress.sh: $*" >&2
  exit 2
}

[ -x "$PG_CONFIG" ] || die "$PG_CONFIG not found: install PostgreSQL 15 (scripts/setup.sh)"
BINDIR=$("$PG_CONFIG" --bindir)
PG_REGRESS=$(dirname "$("$PG_CONFIG" --pgxs)")/../test/regress/pg_regress
[ -x "$PG_REGRESS" ] || die "pg_regress not found at $PG_REGRESS: install postgresql-server-dev-15"
CONTROL=$("$PG_CONFIG" --sharedir)/extension/privmatch.control
[ -f "$CONTROL" ] || die "the privmatch extension is not installed ($CONTROL is missing): run scripts/setup.sh first"

# Nothing from the caller's environment may steer the clients or the server: no PG* connection
# settings, English messages, and no Rust backtraces in error details.
while read -r var; do unset "$var"; done < <(compgen -e | grep '^PG' || true)
unset RUST_BACKTRACE RUST_LIB_BACKTRACE
export LC_ALL=C

WORK=$(mktemp -d /tmp/pm-regress-XXXXXX)
if [ "$(id -u)" = 0 ]; then
  # PostgreSQL refuses to run as root: the cluster, and the clients, run as postgres.
  RUN_USER=postgres
  id "$RUN_USER" >/dev/null 2>&1 || die "running as root needs the user $RUN_USER (scripts/setup.sh)"
  chown "$RUN_USER": "$WORK"
  as_user() { runuser -u "$RUN_USER" -- env HOME="$WORK" "$@"; }
else
  RUN_USER=$(id -un)
  as_user() { "$@"; }
fi

cleanup() {
  local rc=$?
  if [ -f "$WORK/data/postmaster.pid" ]; then
    as_user "$BINDIR/pg_ctl" -D "$WORK/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  if [ "${PRIVMATCH_REGRESS_KEEP:-0}" = 1 ]; then
    echo "regress.sh: kept $WORK (cluster stopped)"
  else
    rm -rf "$WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
cd "$WORK"

if "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$PORT" >/dev/null 2>&1; then
  die "a server already answers on 127.0.0.1:$PORT: set PRIVMATCH_REGRESS_PORT to a free port"
fi

echo "==> throwaway cluster in $WORK (user $RUN_USER, port $PORT)"
as_user "$BINDIR/initdb" -D "$WORK/data" -U "$RUN_USER" -A trust -E UTF8 --locale=C --no-sync \
  >"$WORK/initdb.log" 2>&1 || { cat "$WORK/initdb.log" >&2; die "initdb failed"; }
if ! as_user "$BINDIR/pg_ctl" -D "$WORK/data" -l "$WORK/postgres.log" -w -t 60 \
  -o "-p $PORT -k $WORK -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null; then
  tail -n 20 "$WORK/postgres.log" >&2 || true
  die "the throwaway cluster did not start"
fi

# A clear message when the extension cannot be created, before pg_regress reports it as a
# wall of failed tests.
psql_() { as_user "$BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PORT" -U "$RUN_USER" "$@"; }
psql_ -d postgres -c 'CREATE DATABASE privmatch_preflight'
if ! out=$(psql_ -d privmatch_preflight -c 'CREATE EXTENSION privmatch' 2>&1); then
  echo "$out" >&2
  die "CREATE EXTENSION privmatch failed: is the extension installed and up to date for $("$PG_CONFIG" --version)? Run scripts/setup.sh (or cargo pgrx install in extension/)."
fi
psql_ -d postgres -c 'DROP DATABASE privmatch_preflight'

# pg_regress runs as the cluster's user too: the tests have the server write and read files
# in its output directory (binary COPY).
cp -R "$ROOT/extension/tests" "$WORK/tests"
mkdir "$WORK/out"
[ "$(id -u)" = 0 ] && chown -R "$RUN_USER": "$WORK/tests" "$WORK/out"
if [ $# -gt 0 ]; then tests=("$@"); else tests=(--schedule="$WORK/tests/schedule"); fi

set +e
as_user "$PG_REGRESS" --bindir="$BINDIR" --inputdir="$WORK/tests" --outputdir="$WORK/out" \
  --host=127.0.0.1 --port="$PORT" --user="$RUN_USER" --dbname=contrib_regression "${tests[@]}"
rc=$?
set -e
if [ "$rc" -ne 0 ] && [ -s "$WORK/out/regression.diffs" ]; then
  echo "==> regression.diffs (expected vs. actual)"
  cat "$WORK/out/regression.diffs"
fi
exit "$rc"
