#!/usr/bin/env bash
# Lab, on the device: same-call A/B of fused-kernel variants at decode sizes (lab/NOTES.md).
# Usage (repository root, lab/bin and .libs carried): lab/ab_fused.sh NAME...
# For each NAME with a lab/bin/test_NAME: the decode-size GPU tests (every backend, both formats);
# then two rounds of lab/bin/bench_NAME, fused backend, NVFP4 w4a16 at T = 1, 2, 4, 8 with the
# phase stamps (prep, fc1, hconv, fc2, finalize), one summary line per (round, NAME, T).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp/ab}
mkdir -p "$out"
t0=$SECONDS
for n in "$@"; do
  [ -x lab/bin/test_$n ] || continue
  for f in test_nvfp4_situ_all_T test_mxfp4_situ_all_T test_all_tokens_one_expert_and_empty_experts test_ep_rank_subsets; do
    K3_CUDA_TEST_FILTER=$f timeout 120 lab/bin/test_$n > "$out/test_${n}_$f.log" 2>&1
    echo "test_$n $f rc=$? ($((SECONDS - t0)) s)"
    grep -E "FAILED|rror" "$out/test_${n}_$f.log" | head -3
  done
done
for round in 1 2; do
  for n in "$@"; do
    timeout 60 lab/bin/bench_$n --fmt nvfp4 --backend cuda-fused --T 1,2,4,8 --reps 30 > /tmp/abf.tsv 2>&1
    { echo "## $round $n"; cat /tmp/abf.tsv; } >> "$out/fused.tsv"
    awk -v n=$n -v r=$round '$1 == "k3" {printf "r%s %-6s %-10s T=%-3s %8.1f us  %5.3f of floor  stages %s\n", r, n, $2, $4, $5, $10, $12}' /tmp/abf.tsv
  done
done
timeout 60 lab/bin/bench_main --fmt nvfp4 --backend cuda --T 1,2,4,8 --reps 30 | awk '$1 == "k3" {printf "grouped main T=%-3s %8.1f us  %5.3f of floor  stages %s\n", $4, $5, $10, $12}'
echo "fused total $((SECONDS - t0)) s"
