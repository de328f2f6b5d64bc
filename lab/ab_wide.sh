#!/usr/bin/env bash
# Lab, on the device: same-call A/B of the k_wgp tile widths at prefill sizes.
# Usage (repository root, lab/bin and .libs carried): [TESTS="a b"] [ROUNDS=2] [MODES=..] [PREFILL_T=..]
#   lab/ab_wide.sh NAME:WGP...   (lab/bin/bench_NAME run with --wgp WGP; WGP 0 = automatic)
# TESTS: lab/bin/test_NAME run filtered to test_wgmma_path first, by lab/ab_prefill.sh (TESTS_ONLY).
# One summary line per run; raw rows in $OUT/ab.tsv.
. "$(dirname "$0")/env.sh" /tmp/ab
if [ -n "${TESTS:-}" ]; then
  OUT=$out TESTS_ONLY=1 lab/ab_prefill.sh $TESTS
else
  nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
fi
t0=$SECONDS
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
