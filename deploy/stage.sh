#!/usr/bin/env bash
# Builds the privmatch extension (cargo pgrx package) and the privmatch CLI in release mode
# and lays them out under OUT (default target/docker-stage) as they go into an image:
#   OUT/usr/lib/postgresql/15/lib/privmatch.so
#   OUT/usr/share/postgresql/15/extension/privmatch.control, privmatch--*.sql (with migrations)
#   OUT/usr/local/bin/privmatch
# Used by deploy/Dockerfile's builder and, on a host that already built privmatch
# (scripts/setup.sh), for deploy/prebuilt.Dockerfile: cargo then rebuilds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/docker-stage}
PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
case "$OUT" in /*) ;; *) OUT="$(pwd)/$OUT" ;; esac

rm -rf "$OUT"
mkdir -p "$OUT"
echo "==> cargo pgrx package (extension)"
(cd extension && cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$OUT/pgrx" >/dev/null)
# pgrx lays the package out under the absolute paths of this host's pg_config; the images'
# PostgreSQL is Debian's, so the files go to Debian's paths whatever PG_CONFIG names (a
# PostgreSQL elsewhere on this host must not leave the image without its extension).
IMAGE_LIB=usr/lib/postgresql/15/lib
IMAGE_EXT=usr/share/postgresql/15/extension
mkdir -p "$OUT/$IMAGE_LIB" "$OUT/$IMAGE_EXT"
cp -a "$OUT/pgrx$("$PG_CONFIG" --pkglibdir)"/. "$OUT/$IMAGE_LIB/"
cp -a "$OUT/pgrx$("$PG_CONFIG" --sharedir)/extension"/. "$OUT/$IMAGE_EXT/"
rm -rf "$OUT/pgrx"
install -m 0644 migrations/privmatch--*--*.sql "$OUT/$IMAGE_EXT/"
echo "==> cargo build --release -p privmatch-coordinator (CLI)"
cargo build --release --quiet -p privmatch-coordinator
install -D -m 0755 "${CARGO_TARGET_DIR:-target}/release/privmatch" "$OUT/usr/local/bin/privmatch"
echo "==> staged in $OUT"
