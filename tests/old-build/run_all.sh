#!/bin/bash
# All of issue 34's attacks against the OLD build f21d1f1 (a..f); log in $LOGS/run_all.log.
HERE=$(cd "$(dirname "$0")" && pwd)
export LOGS=${LOGS:-/tmp/pm-old-attacks}; mkdir -p "$LOGS"
cd "$HERE"
{
  echo "== a: local cluster secrets";            ./a_local_cluster.sh | grep -E "^ATTACK|^evidence|Uid|left under|CA sha"
  echo "== b (iris) + f: coordinator learns results; unsigned inputs"; ./run_old_attack.sh b_iris_coordinator_learns_results_and_f_unsigned_inputs
  echo "== b (face)";                            ./run_old_attack.sh b_face_coordinator_learns_subject_and_match_bit
  echo "== c: forged share at one party";        ./run_old_attack.sh c_forged_share_at_one_party
  echo "== d: replayed signed command after restore"; ./run_old_attack.sh d_replayed_signed_command_after_restore
  echo "== e: result changed in transit";        ./run_old_attack.sh e_result_changed_in_transit
} 2>&1 | tee "$LOGS/run_all.log"
