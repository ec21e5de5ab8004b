#!/usr/bin/env bash
# Creates (once) the password of the coordinator's login role at each party, as docker secrets
# in deploy/secrets/ (0600). In a deployment across three organisations, each party's
# operator makes its own and hands it to the coordinator's operator over a private channel.
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p secrets
chmod 0700 secrets
for i in 0 1 2; do
  f=secrets/p${i}_coordinator_password
  if [ ! -s "$f" ]; then
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$f")
    echo "created $(pwd)/$f"
  fi
done
