#!/usr/bin/env bash
# Lab, on the device (lab/bin and .libs carried): a landing check in as little device time as a
# short budget allows. Binaries, built here (nvcc on PATH; each build ~4 min): `make -j2`, copy
# build/tests/tools/cuda_moe_bench to lab/bin/bench_old; apply the change, `make -j2`, copy the
# bench to lab/bin/bench_xc and build/tests/test_cuda_moe to lab/bin/test_xc (other names via
# NAMES); strip lab/bin/*; .libs = libcmocka.so.0, libcjson.so.1, libpcre2-8.so.0 from
# /usr/lib/x86_64-linux-gnu.
# Correctness first (the whole test_xc, then the quick memcheck), then the A/B old vs xc; each
# part's lines go to stdout and $OUT as they come, so a cut-short call still reports what ran.
. "$(dirname "$0")/env.sh" /tmp/xcl; OUT=$out
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader | tee $OUT/summary.txt
t0=$SECONDS
timeout ${TEST_S:-270} lab/bin/test_xc > $OUT/test_xc.log 2>&1; echo "test_xc rc=$? $((SECONDS - t0)) s" | tee -a $OUT/summary.txt
grep -E "^\[  (PASSED|FAILED) \]|FAILED|rror|one expert T=9000|T=2500" $OUT/test_xc.log | head -20 | tee -a $OUT/summary.txt
for round in $(seq ${ROUNDS:-2}); do
  for mode in w4a16-bf16 w4a16; do
    for n in ${NAMES:-old xc}; do
      timeout 90 lab/bin/bench_$n --fmt nvfp4 --backend cuda --mode $mode --T ${TS:-256,2048,8192} --reps 5 > /tmp/xcl_run.tsv 2>&1
      { echo "## $n $mode round $round"; cat /tmp/xcl_run.tsv; } >> "$OUT/ab.tsv"
      awk -v n=$n '$1 == "k3" {printf "%-4s %-10s T=%-5s %9.1f us  %.3f of floor  stages %s\n", n, $13, $4, $5, $10, $12}' /tmp/xcl_run.tsv | tee -a $OUT/summary.txt
      grep -iE "error|fail" /tmp/xcl_run.tsv | head -2
    done
  done
  echo "bench round $round done at $((SECONDS - t0)) s" | tee -a $OUT/summary.txt
done
K3_CUDA_TEST_QUICK=1 timeout ${MEMCHECK_S:-150} compute-sanitizer --tool memcheck --error-exitcode 9 lab/bin/test_xc \
  > $OUT/memcheck.log 2>&1; echo "memcheck test_xc rc=$? at $((SECONDS - t0)) s" | tee -a $OUT/summary.txt
grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5 | tee -a $OUT/summary.txt
