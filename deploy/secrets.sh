#!/usr/bin/env bash
# Creates (once) the password of the coordinator's login role at each party, as docker secrets
# in deploy/secrets/ (0600). In a deployment across three organisations, each party's
# operator makes its own and hands it to the coordinator's operator over a private channel.
# PRIVMATCH_SECRETS_DIR puts them elsewhere (docker-compose.yml reads the same variable).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${PRIVMATCH_SECRETS_DIR:-deploy/secrets}
mkdir -p "$dir"
chmod 0700 "$dir"
for i in 0 1 2; do
  f=$dir/p${i}_coordinator_password
  if [ ! -s "$f" ]; then
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$f")
    echo "created $f"
  fi
done
