#!/usr/bin/env bash
# Makes local base images for the privmatch Dockerfiles on a machine that cannot pull from an
# image registry. A user with a registry does not need this: the Dockerfiles default to the
# official images (postgres:15-bookworm, rust:1.95-bookworm).
#
#   privmatch-local/debian:bookworm   Debian 12 minbase from Debian's packages (debootstrap),
#                                     with ca-certificates and this host's extra CAs
#   privmatch-local/rust:1.95-bookworm  the same plus this host's Rust toolchain (rustc, cargo)
#
# Each image is made once and reused (its tag is the cache); --rebuild makes them again;
# --no-rust makes the Debian image only.
# Needs root (debootstrap) and Docker. Prints the two tags on its last line.
set -euo pipefail

DEBIAN_TAG=privmatch-local/debian:bookworm
RUST_TAG=privmatch-local/rust:1.95-bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
WORK=${PRIVMATCH_BASE_WORK:-/var/tmp/privmatch-base}
REBUILD=0
WITH_RUST=1
for arg in "$@"; do
  case "$arg" in
    --rebuild) REBUILD=1 ;;
    --no-rust) WITH_RUST=0 ;; # only the Debian image (enough for prebuilt images)
    *) echo "usage: deploy/base-images.sh [--rebuild] [--no-rust]" >&2; exit 2 ;;
  esac
done

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

make_debian() {
  if ! command -v debootstrap >/dev/null; then
    echo "==> installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  local root="$WORK/rootfs"
  rm -rf "$root"
  mkdir -p "$root"
  echo "==> debootstrap --variant=minbase bookworm (about a minute)"
  debootstrap --variant=minbase --include=ca-certificates bookworm "$root" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log"; exit 1; }
  # The host's own CAs (e.g. an egress proxy's) so that apt and cargo in builds trust what
  # the host trusts.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null
  fi
  # Images are small and rebuilt rarely: no apt lists, no caches.
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
  echo "==> docker import $DEBIAN_TAG"
  tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' - "$DEBIAN_TAG" >/dev/null
  rm -rf "$root"
}

make_rust() {
  local sysroot
  sysroot=$(rustc --print sysroot)
  local version
  version=$(rustc --version)
  case "$version" in
    "rustc 1.95."*) ;;
    *) echo "this host's rustc is '$version'; the build needs 1.95" >&2; exit 1 ;;
  esac
  local ctx="$WORK/rust"
  rm -rf "$ctx"
  mkdir -p "$ctx/toolchain"
  # rustc, cargo and the host target's standard library only (no docs, no sources).
  cp -a "$sysroot/bin" "$ctx/toolchain/"
  mkdir -p "$ctx/toolchain/lib/rustlib"
  find "$sysroot/lib" -maxdepth 1 -name 'lib*' \( -type f -o -type l \) -exec cp -a {} "$ctx/toolchain/lib/" \;
  cp -a "$sysroot/lib/rustlib/x86_64-unknown-linux-gnu" "$ctx/toolchain/lib/rustlib/"
  cat >"$ctx/Dockerfile" <<EOF
FROM $DEBIAN_TAG
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null \\
 && rm -rf /var/lib/apt/lists/*
COPY toolchain/ /usr/local/
ENV CARGO_HOME=/usr/local/cargo PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
EOF
  echo "==> docker build $RUST_TAG (this host's $version)"
  docker build -q -t "$RUST_TAG" "$ctx" >/dev/null
  rm -rf "$ctx"
}

mkdir -p "$WORK"
if [ $REBUILD = 1 ] || ! have_image "$DEBIAN_TAG"; then
  make_debian
  REBUILD=1
fi
if [ $WITH_RUST = 1 ] && { [ $REBUILD = 1 ] || ! have_image "$RUST_TAG"; }; then
  make_rust
fi
echo "$DEBIAN_TAG $RUST_TAG"
