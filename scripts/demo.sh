#!/usr/bin/env bash
# The privmatch demo on a fresh machine: installs what is needed, starts three local parties
# and the coordinator, enrols a few thousand synthetic iris templates (secret-shared and sealed
# on the client side), shows how many records each party holds, then searches: rotated
# near-duplicates of enrolled templates are identified, strangers are not, and an
# enrol-if-unique of a near-duplicate is refused. Then faces (Funshade): the dealer P2 is
# configured with a secret threshold, deals single-use keys to P0 and P1, 1,000 synthetic face
# embeddings are enrolled, and noisy re-captures and impostors are verified and identified.
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

PROBES="${TMPDIR:-/tmp}/privmatch-demo-probes.ndjson"
# Same seed: the first 3 templates are enrolled ones; their 3 near-duplicates are rotated by 9
# columns with 20 % of the bits flipped. Then 3 strangers (another seed).
"$PM" iris synth 3 --seed 2026 --near-duplicates 3 --flip-rate 0.2 --rotation 9 --prefix probe --output "$PROBES"
"$PM" iris synth 3 --seed 7 --prefix stranger --output "$PROBES.strangers"
cat "$PROBES.strangers" >> "$PROBES"
echo "==> privmatch iris search --input $PROBES   (9 probes: 3 enrolled templates, their 3 rotated near-duplicates, 3 strangers)"
"$PM" iris search --input "$PROBES" --json
echo "==> privmatch iris search --input $PROBES --uniqueness"
"$PM" iris search --input "$PROBES" --uniqueness --json
echo "==> privmatch iris enroll --if-unique (a near-duplicate of an enrolled template, and a stranger)"
"$PM" iris synth 1 --seed 2026 --near-duplicates 1 --flip-rate 0.2 --rotation 5 --prefix late --output "$PROBES.late"
tail -n 1 "$PROBES.late" > "$PROBES.late1"
head -n 1 "$PROBES.strangers" >> "$PROBES.late1"
"$PM" iris enroll --input "$PROBES.late1" --if-unique
FACES="${TMPDIR:-/tmp}/privmatch-demo-faces.ndjson"
FACE_PROBES="${TMPDIR:-/tmp}/privmatch-demo-face-probes.ndjson"
echo "==> faces: 1,000 synthetic 512-dimensional embeddings, their noisy re-captures, 3 impostors"
"$PM" face synth --subjects 1000 --dim 512 --seed 2026 --out "$FACES" --probes "$FACE_PROBES.all" --impostors 3
# Probes: the re-captures of the first 3 subjects, then the 3 impostors (the file's last lines).
{ head -n 3 "$FACE_PROBES.all"; tail -n 3 "$FACE_PROBES.all"; } > "$FACE_PROBES"
echo "==> privmatch face configure --metric cosine --threshold 0.7 --dim 512   (sealed to the dealer P2: P0, P1 and the coordinator never see the threshold)"
"$PM" face configure --metric cosine --threshold 0.7 --dim 512
echo "==> privmatch face enroll --input $FACES   (shares at P0 and P1 only)"
"$PM" face enroll --input "$FACES"
echo "==> privmatch face verify --subject face-0000000 --input $FACE_PROBES   (6 probes: re-captures of face-0000000..2, then 3 impostors)"
"$PM" face verify --subject face-0000000 --input "$FACE_PROBES"
echo "==> privmatch face identify --input $FACE_PROBES   (1:N over the 1,000 enrolled: opens them once, then P2 deals one key per comparison)"
"$PM" face identify --input "$FACE_PROBES"
echo "==> privmatch face dealer"
"$PM" face dealer

cat <<MSG

The cluster keeps running. Try:
  $PM iris search --input $PROBES               # one line per probe; --json, --uniqueness, --max-rotation 0
  $PM bench iris --n 10000                      # the search benchmark (see BENCHMARKS.md)
  $PM face identify --input $FACE_PROBES         # faces: {"probe": i, "matches": [...]}
  $PM bench face --n 10000                      # the face benchmark (see BENCHMARKS.md)
  $PM iris delete --subject synth-0000000
  $PM cluster status
  $PM cluster down            # stop (data kept); add --purge to delete everything
MSG
