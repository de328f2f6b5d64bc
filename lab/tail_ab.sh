#!/usr/bin/env bash
# Lab, on the device (lab/bin and .libs carried): tail items A/B in one binary, then its tests.
# lab/bin/bench_tail and test_tail: main with lab/pending/tail_items.patch, built with
# `r.hb16 = ... && !getenv("K3_LAB_HB32")` in moe_run.cu so the same binary also gives the fp32-h
# A/B. Variants per process: off (--tail -1), auto (--tail 0), t48 (--tail 48), hb32 (auto with
# K3_LAB_HB32=1, w4a16-bf16 only). Bench first (short), then the whole test, then quick memcheck.
. "$(dirname "$0")/env.sh" /tmp/tab; OUT=$out
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $OUT/summary.txt
t0=$SECONDS
bench() { # variant mode
  local v=$1 mode=$2 tail=0 envs=""
  case $v in off) tail=-1;; t48) tail=48;; hb32) envs="K3_LAB_HB32=1";; esac
  env $envs timeout 90 lab/bin/bench_tail --fmt nvfp4 --backend cuda --mode $mode --T ${TS:-2048,4096,6144,8192} \
    --reps 5 --tail $tail > /tmp/tab_run.tsv 2>&1
  { echo "## $v $mode"; cat /tmp/tab_run.tsv; } >> "$OUT/ab.tsv"
  awk -v n=$v '$1 == "k3" {printf "%-4s %-10s T=%-5s %9.1f us  %.3f of floor  stages %s\n", n, $13, $4, $5, $10, $12}' /tmp/tab_run.tsv | tee -a $OUT/summary.txt
  grep -iE "error|fail" /tmp/tab_run.tsv | head -2
}
for round in $(seq ${ROUNDS:-3}); do
  for v in off auto t48 hb32; do bench $v w4a16-bf16; done
  for v in off auto t48; do bench $v w4a16; done
  echo "bench round $round done at $((SECONDS - t0)) s" | tee -a $OUT/summary.txt
done
timeout ${TEST_S:-280} lab/bin/test_tail > $OUT/test.log 2>&1; echo "test_tail rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) \]|FAILED|rror" $OUT/test.log | head -20 | tee -a $OUT/summary.txt
K3_CUDA_TEST_QUICK=1 timeout ${MEMCHECK_S:-150} compute-sanitizer --tool memcheck --error-exitcode 9 lab/bin/test_tail \
  > $OUT/memcheck.log 2>&1; echo "memcheck rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/summary.txt
grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5 | tee -a $OUT/summary.txt
