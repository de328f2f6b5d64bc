#!/usr/bin/env bash
# Lab, on the device: same-call A/B of the k_wgp tile widths at prefill sizes.
# Usage (repository root, lab/bin and .libs carried): [TESTS="a b"] [ROUNDS=2] [MODES=..] [PREFILL_T=..]
#   lab/ab_wide.sh NAME:WGP...   (lab/bin/bench_NAME run with --wgp WGP; WGP 0 = automatic)
# TESTS: lab/bin/test_NAME run filtered to test_wgmma_path first (widest relL2 per width).
# One summary line per run; raw rows in $OUT/ab.tsv.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp/ab}
mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$SECONDS
for n in ${TESTS:-}; do
  K3_CUDA_TEST_FILTER=test_wgmma_path timeout ${TEST_TIMEOUT:-240} lab/bin/test_$n > "$out/test_$n.log" 2>&1
  echo "test_$n test_wgmma_path rc=$? ($((SECONDS - t0)) s)"
  grep -E "FAILED|SKIP|rror" "$out/test_$n.log" | head -5
  awk '/relL2/ {for (i = 1; i <= NF; i++) if ($i == "relL2") v = $(i + 1); w = $2; n[w]++; if (v + 0 > m[w]) m[w] = v + 0}
       END {for (w in m) printf "  width %s: %d cases, max relL2 %.3g\n", w, n[w], m[w]}' "$out/test_$n.log"
done
for mode in ${MODES:-w4a16 w4a16-bf16}; do
  for round in $(seq ${ROUNDS:-2}); do
    for nw in "$@"; do
      n=${nw%:*} p=${nw#*:}
      timeout 120 lab/bin/bench_$n --fmt ${FMT:-nvfp4} --backend cuda --mode $mode --T ${PREFILL_T:-4096,6144,8192} --reps 5 \
        --wgp $p > /tmp/ab_run.tsv 2>&1
      { echo "## $n wgp $p $mode round $round"; cat /tmp/ab_run.tsv; } >> "$out/ab.tsv"
      awk -v n=$n -v p=$p '$1 == "k3" {printf "%-7s wgp%-3s %-10s T=%-5s %9.1f us  %s\n", n, p, $13, $4, $5, $12}' \
        /tmp/ab_run.tsv
      grep -iE "error|fail" /tmp/ab_run.tsv | head -2
    done
  done
done
echo "total $((SECONDS - t0)) s"
