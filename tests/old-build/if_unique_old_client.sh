#!/bin/bash
# Attack g (enroll-if-unique outcome changed in transit) against the 0.12.0 client (6fd0073):
# runs the current suite's test `an_enroll_if_unique_outcome_changed_in_transit_is_refused`
# with the parties and the coordinator of the tree under test and every client command from
# the 0.12.0 CLI. The test fails there (the flipped outcome is accepted: the attack succeeds)
# and passes with the current CLI.
# Usage (from the repository root): tests/old-build/if_unique_old_client.sh OLD_CLI
set -eu
OLD_CLI=$(readlink -f "${1:?the privmatch CLI of 6fd0073}")
NEW_CLI=$(pwd)/target/release/privmatch
WRAP=$(mktemp -d)/privmatch-mixed
cat >"$WRAP" <<WRAPPER
#!/bin/bash
for a in "\$@"; do [ "\$a" = cluster ] && exec "$NEW_CLI" "\$@"; done
exec "$OLD_CLI" "\$@"
WRAPPER
chmod +x "$WRAP"
PRIVMATCH_BIN=$WRAP cargo test --release -p privmatch-e2e --test iris_search_cli -- \
  --test-threads=1 an_enroll_if_unique_outcome_changed_in_transit_is_refused
