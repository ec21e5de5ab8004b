#!/usr/bin/env bash
# Installs everything privmatch needs on a fresh Debian machine (run as root, or with sudo
# available): PostgreSQL 15 with server headers, clang for bindgen, cargo-pgrx at the pinned
# version; then builds and installs the extension and the privmatch CLI. Idempotent: what is
# already there is not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."

PGRX_VERSION=0.18.1
PG_MAJOR=15
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

need_apt=()
for pkg in postgresql-$PG_MAJOR postgresql-server-dev-$PG_MAJOR libclang-dev clang pkg-config libssl-dev m4; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
# Debian starts a default cluster on 5432; privmatch does not use it.

if ! cargo pgrx --version 2>/dev/null | grep -q "$PGRX_VERSION"; then
  echo "==> installing cargo-pgrx $PGRX_VERSION"
  cargo install cargo-pgrx --version "=$PGRX_VERSION" --locked
fi
# Another PostgreSQL 15 (a relocated copy, a custom build) can be named with PG_CONFIG; the
# tests and the CLI find it through the `pg_config` first on PATH.
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/$PG_MAJOR/bin/pg_config}
if ! grep -q "pg$PG_MAJOR" "${PGRX_HOME:-$HOME/.pgrx}/config.toml" 2>/dev/null; then
  cargo pgrx init --pg$PG_MAJOR "$PG_CONFIG"
fi

echo "==> building and installing the privmatch extension"
(cd extension && $SUDO env "PATH=$PATH" "HOME=$HOME" cargo pgrx install --release --pg-config "$PG_CONFIG" >/dev/null)
# The upgrade scripts (ALTER EXTENSION privmatch UPDATE) from earlier versions.
$SUDO install -m 0644 migrations/privmatch--*--*.sql "$("$PG_CONFIG" --sharedir)/extension/"
echo "==> building the privmatch CLI"
cargo build --release -p privmatch-coordinator --quiet
echo "==> ready: $(pwd)/target/release/privmatch"
