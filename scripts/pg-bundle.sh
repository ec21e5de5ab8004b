#!/usr/bin/env bash
# Packs what the whole-search check of scripts/gpu-check.sh needs on a machine that has a GPU
# but neither PostgreSQL nor Rust: this machine's PostgreSQL (the one $PG_CONFIG or `pg_config`
# names) with the extension installed into it, the shared libraries they load, the `privmatch`
# CLI and the e2e test binary `iris_search_cli`, into one .tar.xz.
#
#   scripts/pg-bundle.sh target/gpu-check/pg-bundle.tar.xz
#
# There: `tar -xJf pg-bundle.tar.xz -C DIR && . DIR/env.sh` puts the bundle's PostgreSQL and CLI
# first on PATH and, of the bundled libraries, only those the machine lacks on its library path
# (so its own newer C++ runtime, OpenSSL etc. stay in use). PostgreSQL finds its share and lib
# directories relative to its binaries, so the tree keeps their absolute paths under DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_FILE=${1:?usage: scripts/pg-bundle.sh OUT.tar.xz}
PG_CONFIG=${PG_CONFIG:-$(command -v pg_config)}
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT

echo "==> PostgreSQL from $PG_CONFIG ($("$PG_CONFIG" --version))"
bindir=$("$PG_CONFIG" --bindir)
pkglibdir=$("$PG_CONFIG" --pkglibdir)
sharedir=$("$PG_CONFIG" --sharedir)
mkdir -p "$STAGE$bindir" "$STAGE$pkglibdir" "$STAGE$sharedir"
cp -a "$bindir/." "$STAGE$bindir/"
# Without the JIT (its LLVM alone is larger than the rest): PostgreSQL runs without it.
(cd "$pkglibdir" && find . -maxdepth 1 -name '*.so' ! -name 'llvmjit*' -exec cp -a {} "$STAGE$pkglibdir/" \;)
cp -a "$sharedir/." "$STAGE$sharedir/"

echo "==> the extension, packaged for that PostgreSQL"
(cd extension && cargo pgrx package --pg-config "$PG_CONFIG" --out-dir "$STAGE/package" >/dev/null)
cp -a "$STAGE/package/." "$STAGE/"
rm -rf "$STAGE/package"

echo "==> the CLI and the e2e test"
cargo build --release -p privmatch-coordinator --bin privmatch
mkdir -p "$STAGE/bin" "$STAGE/e2e"
cp target/release/privmatch "$STAGE/bin/"
test_bin=$(cargo test --release -p privmatch-e2e --test iris_search_cli --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "iris_search_cli":
        print(m["executable"])')
cp "$test_bin" "$STAGE/e2e/iris_search_cli"
strip --strip-debug "$STAGE/bin/privmatch" "$STAGE/e2e/iris_search_cli"

echo "==> the shared libraries they load (but the C library and the C++ runtime)"
mkdir -p "$STAGE/syslib"
find "$STAGE$bindir" "$STAGE$pkglibdir" "$STAGE/bin" "$STAGE/e2e" -type f -perm -u+x -o -name '*.so' -type f |
    xargs -r ldd 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64)\.so' |
    while read -r lib; do cp -L "$lib" "$STAGE/syslib/"; done

cat >"$STAGE/env.sh" <<EOF
# Sourced by scripts/gpu-check.sh (written by scripts/pg-bundle.sh).
PM_BUNDLE=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
mkdir -p "\$PM_BUNDLE/lib-missing"
for lib in "\$PM_BUNDLE"/syslib/*; do
    name=\$(basename "\$lib")
    ldconfig -p | grep -q "^[[:space:]]\$name (" || cp -a "\$lib" "\$PM_BUNDLE/lib-missing/"
done
echo "bundled libraries this machine lacks: \$(ls "\$PM_BUNDLE/lib-missing" | tr '\n' ' ')"
export PATH="\$PM_BUNDLE$bindir:\$PM_BUNDLE/bin:\$PATH"
export LD_LIBRARY_PATH="\$PM_BUNDLE/lib-missing:\${LD_LIBRARY_PATH:-}"
export PRIVMATCH_BIN="\$PM_BUNDLE/bin/privmatch"
EOF
tar -cJf "$OUT_FILE" -C "$STAGE" .
echo "==> $OUT_FILE: $(du -h "$OUT_FILE" | cut -f1)"
