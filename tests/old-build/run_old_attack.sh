#!/bin/bash
# Runs one attack test of old_attacks.rs against the OLD build f21d1f1: the old CLI and the old
# extension in a relocated PostgreSQL (README.md here says how they are made). The test builds
# against f21d1f1's crates, so it is linked into that worktree's tests/tests/ first.
# Usage: run_old_attack.sh <test-name-filter>; log in $LOGS/<filter>.log
set -u
F=${1:?test name}
HERE=$(cd "$(dirname "$0")" && pwd)
OLD_TREE=${OLD_TREE:-/work/old}
PGOLD=${PGOLD:-/work/pgold}
LOGS=${LOGS:-/tmp/pm-old-attacks}; mkdir -p "$LOGS"
ln -sf "$HERE/old_attacks.rs" "$OLD_TREE/tests/tests/old_attacks.rs"
export PATH=$PGOLD/lib/postgresql/15/bin:$PATH
export PRIVMATCH_BIN=${OLD_BIN:-$PGOLD/bin/privmatch-f21d1f1}
export CARGO_TARGET_DIR=${OLD_TARGET:-/work/old-target} PGRX_HOME=$PGOLD/pgrx-home
cd "$OLD_TREE"
nice -n 19 cargo test --release -p privmatch-e2e --test old_attacks -- --test-threads=1 --nocapture "$F" 2>&1 | tee "$LOGS/$F.log" | grep -E "^ATTACK|test result|panicked"
