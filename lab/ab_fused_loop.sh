#!/usr/bin/env bash
# Lab, on the device: lab/pending/fused_loop.patch (NOTES v21) against the tree, in one call.
# Build here first:
#   make -j2 && cp build/tests/tools/cuda_moe_bench lab/bin/bench_main && strip lab/bin/bench_main
#   cp build/tests/test_cuda_moe lab/bin/test_main && strip lab/bin/test_main
#   PATCH=lab/pending/fused_loop.patch WITH_TEST=1 lab/variant.sh fl moe_run
# then run with carry ["lab/bin", ".libs"]. The patch's GPU tests and memcheck come first (its
# first version failed them); then the fused backend at T = 1 / 2 / 4 / 8 / 64 with its phase
# stamps and the grouped backend per format, two rounds in opposite order.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp/ab}; mkdir -p "$out"
b=lab/bin
t0=$SECONDS
exec > >(tee "$out/log.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 120 $b/test_fl > "$out/test_fl.log" 2>&1
echo "test_fl rc=$? ($((SECONDS - t0)) s)"; grep -E "PASSED|FAILED" "$out/test_fl.log" | head -5
K3_CUDA_TEST_FILTER=test_ep_rank_subsets timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
  $b/test_fl > "$out/memcheck_fl.log" 2>&1
echo "memcheck test_fl rc=$? ($((SECONDS - t0)) s)"; grep -E "ERROR SUMMARY" "$out/memcheck_fl.log"
for r in 1 2; do
  ns="main fl"; [ $r = 2 ] && ns="fl main"
  for n in $ns; do
    timeout 40 $b/bench_$n --fmt nvfp4 --backend cuda-fused --T 1,2,4,8,64 --reps 30 |
      awk -v n=$n -v r=$r '$1 == "k3" {printf "r%s %-5s fused   %s T=%-3s %8.1f us %5.3f of floor  stages %s\n", r, n, $3, $4, $5, $10, $12}'
    for f in nvfp4 mxfp4; do
      timeout 40 $b/bench_$n --fmt $f --backend cuda --T 1,8,64,256 --reps 10 |
        awk -v n=$n -v r=$r '$1 == "k3" {printf "r%s %-5s grouped %s T=%-3s %8.1f us %5.3f of floor\n", r, n, $3, $4, $5, $10}'
    done
  done
done
echo "done $((SECONDS - t0)) s"
