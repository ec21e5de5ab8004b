#!/usr/bin/env bash
# Runs every privmatch test on a fresh machine: installs what is needed (scripts/setup.sh),
# then formatting and lint checks, the pure-Rust unit and property tests, the SQL regression
# tests of the extension against a throwaway cluster, the end-to-end tests against three
# real local parties and the coordinator, and the docker compose deployment.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings
cargo clippy -p privmatch-coordinator --features fault-injection --quiet -- -D warnings

echo "==> unit and property tests (core, coordinator, the layout rules, the extension's pure-Rust parts)"
cargo test --release -p privmatch-core -p privmatch-api -p privmatch-gpu -p privmatch-coordinator -p privmatch-layout
(cd extension && cargo test --release --lib)

echo "==> Paillier interoperability with python-paillier (phe)"
# A private virtual environment with the pinned phe, reused when present.
PHE_VENV=target/python-phe
if ! "$PHE_VENV/bin/python" -c 'import phe' 2>/dev/null; then
  python3 -m venv "$PHE_VENV"
  "$PHE_VENV/bin/pip" install --quiet phe==1.5.0
fi
cargo build --release -p privmatch-core --example paillier_interop --quiet
"$PHE_VENV/bin/python" tests/python/test_phe_interop.py target/release/examples/paillier_interop

echo "==> SQL regression tests (extension)"
bash scripts/regress.sh

echo "==> end-to-end tests (three local parties + coordinator)"
# The tests inject faults (PRIVMATCH_FAULT), which only a build with this feature reads; the
# CLI of setup.sh and of a release has none. The test build is copied aside, and the plain
# build (cached, so only copied back) stays target/release/privmatch.
cargo build --release -p privmatch-coordinator --features fault-injection --quiet
cp target/release/privmatch target/release/privmatch-fault-injection
cargo build --release -p privmatch-coordinator --quiet
PRIVMATCH_BIN="$(pwd)/target/release/privmatch-fault-injection" cargo test --release -p privmatch-e2e

# The load runner, briefly, on a local cluster whose coordinator–party links are delayed (the
# relay of `privmatch cluster up --link-delay-ms`): it must run, count and pass its checks (the
# delayed links' among them); its figures are benchmarks and are not read here.
echo "==> load runner smoke (tests/pgbench/load.sh, 5 ms links)"
timeout 600 tests/pgbench/load.sh --target local --scripts iris-identify,face-verify \
    --clients 1,2 --duration 3 --iris 100 --faces 20 --link-delay-ms 5

# The docker compose deployment end to end (deploy/smoke.sh: SKIP where Docker is absent):
# images, key ceremony, enrolment and matching through the coordinator and through SQL, the
# coordinator and a party killed, down/up.
echo "==> docker compose deployment (deploy/smoke.sh)"
timeout 1500 bash deploy/smoke.sh
