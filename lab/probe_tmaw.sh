#!/usr/bin/env bash
# Lab, on the device (v30): the TMA-weights build's wgmma-path test, the same-call A/B against
# the current build and the evict-first variant, then a quick memcheck (the run is cut short
# there when the device time runs out). Carry lab/bin and .libs; see lab/NOTES.md "Next" 000.
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.libs
out=${OUT:-/tmp/ab}; mkdir -p "$out"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$SECONDS
K3_CUDA_TEST_FILTER=test_wgmma_path timeout 180 lab/bin/test_tmawc > $out/test_tmawc.log 2>&1; echo "test_tmawc rc=$? ($((SECONDS-t0)) s)"
grep -E "PASSED|FAILED|SKIP|rror" $out/test_tmawc.log | head -8
awk '/relL2/ {for (i = 1; i <= NF; i++) if ($i == "relL2") v = $(i + 1); w = $2; n[w]++; if (v + 0 > m[w]) m[w] = v + 0}
     END {for (w in m) printf "  width %s: %d cases, max relL2 %.3g\n", w, n[w], m[w]}' $out/test_tmawc.log
ROUNDS=2 PREFILL_T=2048,4096,8192 OUT=$out lab/ab_wide.sh cur:0 tmawc:0 tmawef:0
command -v compute-sanitizer >/dev/null || export PATH=$PATH:/usr/local/cuda/bin
K3_CUDA_TEST_QUICK=1 K3_CUDA_TEST_FILTER=test_wgmma_path timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 lab/bin/test_tmawc > $out/memcheck_tmawc.log 2>&1
echo "memcheck test_tmawc rc=$? ($((SECONDS-t0)) s)"; grep -E "ERROR SUMMARY|PASSED|FAILED" $out/memcheck_tmawc.log | head -4
