#!/usr/bin/env bash
# Builds the privmatch images for docker-compose.yml.
#
#   bash deploy/images.sh              from source (deploy/Dockerfile), as `docker compose
#                                      build` does
#   bash deploy/images.sh --prebuilt   from the binaries built on this host (deploy/stage.sh,
#                                      then deploy/prebuilt.Dockerfile): seconds once the host
#                                      has built privmatch (scripts/setup.sh)
#
# Base images: the official ones by default; with PRIVMATCH_LOCAL_BASE=1 (or when no registry
# is reachable: set it), the local ones of deploy/base-images.sh, made once and reused.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-source}

if [ "${PRIVMATCH_LOCAL_BASE:-0}" = 1 ]; then
  base_args=()
  [ "$MODE" = --prebuilt ] && base_args=(--no-rust)
  read -r debian rust < <(bash deploy/base-images.sh "${base_args[@]}" | tail -1)
  export PRIVMATCH_PG_IMAGE=$debian PRIVMATCH_DEBIAN_IMAGE=$debian PRIVMATCH_RUST_IMAGE=$rust
fi
args=(--build-arg "PG_IMAGE=${PRIVMATCH_PG_IMAGE:-postgres:15-bookworm}"
  --build-arg "RUST_IMAGE=${PRIVMATCH_RUST_IMAGE:-rust:1.95-bookworm}"
  --build-arg "DEBIAN_IMAGE=${PRIVMATCH_DEBIAN_IMAGE:-debian:bookworm-slim}")
# The workspace version (Cargo.toml), unless PRIVMATCH_TAG names another.
tag=${PRIVMATCH_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)}

# docker build, quiet, without the classic builder's deprecation banner.
build() {
  docker build -q "$@" 2> >(grep -v -e DEPRECATED -e 'buildx' -e 'docs.docker.com' -e '^[[:space:]]*$' >&2) >/dev/null
}

case "$MODE" in
  source | --source)
    build "${args[@]}" -f deploy/Dockerfile --target party -t "privmatch/party:$tag" .
    build "${args[@]}" -f deploy/Dockerfile --target coordinator -t "privmatch/coordinator:$tag" .
    ;;
  --prebuilt)
    # PRIVMATCH_KEEP_STAGE=1 packs target/docker-stage as it is (staged before).
    [ "${PRIVMATCH_KEEP_STAGE:-0}" = 1 ] || bash deploy/stage.sh
    # The runtime stages come before the build stage: the build from source is not run.
    build "${args[@]}" -f deploy/Dockerfile --target party-runtime -t privmatch/party-runtime:local .
    build "${args[@]}" -f deploy/Dockerfile --target coordinator-runtime -t privmatch/coordinator-runtime:local .
    build -f deploy/prebuilt.Dockerfile --target party -t "privmatch/party:$tag" .
    build -f deploy/prebuilt.Dockerfile --target coordinator -t "privmatch/coordinator:$tag" .
    ;;
  *) echo "usage: deploy/images.sh [--prebuilt]" >&2; exit 2 ;;
esac
echo "images: privmatch/party:$tag privmatch/coordinator:$tag"
