#!/usr/bin/env bash
# Lab, on the device: same-call A/B of prefill-size GEMM variants (lab/NOTES.md "Next").
# Usage (from the repository root, with lab/bin and .libs carried; MODES, WGPS and PREFILL_T narrow the runs):
#   [SKIP_TESTS=1] [TEST_TIMEOUT=S] [TESTS_ONLY=1] lab/ab_prefill.sh NAME...   e.g. lab/ab_prefill.sh old sw128
# For each NAME with a lab/bin/test_NAME: test_wgmma_path (every pinned width, both formats)
# with the widest relL2 per width; then, for each NAME, lab/bin/bench_NAME at T = 1024 .. 8192,
# NVFP4, both modes, with the automatic path and the warp-specialized widths 80 and 48 forced.
# One summary line per run; the raw TSV rows go to $OUT/ab.tsv (the device returns 8 files).
. "$(dirname "$0")/env.sh" /tmp/ab
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$SECONDS
for n in "$@"; do
  [ -x lab/bin/test_$n ] && [ -z "${SKIP_TESTS:-}" ] || continue
  K3_CUDA_TEST_FILTER=test_wgmma_path timeout ${TEST_TIMEOUT:-240} lab/bin/test_$n > "$out/test_$n.log" 2>&1
  echo "test_$n test_wgmma_path rc=$? ($((SECONDS - t0)) s)"
  grep -E "FAILED|SKIP|rror" "$out/test_$n.log" | head -5
  awk -f lab/widths.awk "$out/test_$n.log"
done
[ -n "${TESTS_ONLY:-}" ] && exit 0
for mode in ${MODES:-w4a16 w4a16-bf16}; do
  for p in ${WGPS:-0 80 48}; do
    for n in "$@"; do
      timeout 90 lab/bin/bench_$n --fmt nvfp4 --backend cuda --mode $mode --T ${PREFILL_T:-1024,2048,4096,8192} --reps 5 --wgp $p \
        > /tmp/ab_run.tsv 2>&1
      { echo "## $n wgp $p $mode"; cat /tmp/ab_run.tsv; } >> "$out/ab.tsv"
      awk -v n=$n -v p=$p '$1 == "k3" {printf "%-6s wgp%-2s %-10s T=%-5s %9.1f us %6.1f TF  %s\n", n, p, $13, $4, $5, $11, $12}' \
        /tmp/ab_run.tsv
    done
  done
done
echo "total $((SECONDS - t0)) s"
