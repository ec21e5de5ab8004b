#!/usr/bin/env bash
# The privmatch demo on a fresh machine: installs what is needed, starts three local parties
# and the coordinator, enrols a few thousand synthetic iris templates (secret-shared and sealed
# on the client side), and shows how many records each party holds.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
PM="$(pwd)/target/release/privmatch"
N="${PRIVMATCH_DEMO_N:-3000}"
INPUT="${TMPDIR:-/tmp}/privmatch-demo-$N.ndjson"

echo "==> privmatch cluster up"
"$PM" cluster up
echo "==> synthesising $N iris templates (plus 50 rotated near-duplicates) into $INPUT"
"$PM" iris synth "$N" --seed 2026 --near-duplicates 50 --flip-rate 0.08 --rotation 4 --output "$INPUT"
echo "==> privmatch iris enroll --input $INPUT"
"$PM" iris enroll --input "$INPUT"
echo "==> records per party"
"$PM" cluster status
cat <<MSG

The cluster keeps running. Try:
  $PM iris delete --subject synth-0000000
  $PM cluster status
  $PM cluster down            # stop (data kept); add --purge to delete everything
MSG
