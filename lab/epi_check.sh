#!/usr/bin/env bash
# Lab, on the device (lab/bin and .libs carried): the thirtieth session's FC1 epilogue checks in
# one call (lab/NOTES.md v36). Binaries, built here after `make` with nvcc:
#   old:      cp build/tests/tools/cuda_moe_bench lab/bin/bench_old && strip lab/bin/bench_old
#   st12:     WITH_TEST=1 lab/variant.sh st12 moe_prefill_ws -DWP_MAX_STAGES=12
#   amax:     PATCH=lab/pending/fc1_hmax_shared.patch WITH_TEST=1 lab/variant.sh amax moe_prefill_ws
#   amax12:   PATCH=lab/pending/fc1_hmax_shared.patch lab/variant.sh amax12 moe_prefill_ws -DWP_MAX_STAGES=12
#   probe(12): NVCC_CHECK=0 PATCH=lab/pending/wgp_probe.patch lab/variant.sh probe moe_prefill_ws (probe12: + the -D)
#             (its counters serialize the wgmma of the two-term 80-token and FC2 kernels; the FC1
#             48 / 160 SiTU kernels it reads are not among them)
# Prints a T = 8 smoke per binary, the wgmma-path tests, the probes (CTA 0's cycles: producer
# blocked on a full ring / on the table; consumer epilogue share), then the A/B.
. "$(dirname "$0")/env.sh" /tmp/epi; OUT=$out
nvidia-smi --query-gpu=name --format=csv,noheader
for n in old st12 amax amax12 probe probe12; do echo "smoke $n $(timeout 30 lab/bin/bench_$n --fmt nvfp4 --backend cuda --mode w4a16 --T 8 --reps 2 2>&1 | awk '$1=="k3"{print $4,$5} /rror/' | head -2)"; done
for n in st12 amax; do K3_CUDA_TEST_FILTER=test_wgmma_path timeout 150 lab/bin/test_$n > $OUT/t_$n.log 2>&1; echo "test_$n rc=$?"; awk -f lab/widths.awk $OUT/t_$n.log; grep -E "FAIL|rror" $OUT/t_$n.log | head -3; done
K3_CUDA_TEST_QUICK=1 timeout 100 lab/bin/test_amax > $OUT/whole_amax.log 2>&1; echo "test_amax whole quick rc=$?"; grep -E "PASSED|FAILED" $OUT/whole_amax.log
K3_CUDA_TEST_FILTER=test_wgmma_path K3_CUDA_TEST_QUICK=1 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 lab/bin/test_amax > $OUT/mc.log 2>&1; echo "memcheck amax rc=$?"; grep "ERROR SUMMARY" $OUT/mc.log
for n in probe probe12; do for mode in w4a16-bf16 w4a16; do for T in 2048 8192; do echo "== $n $mode $T"; timeout 60 lab/bin/bench_$n --fmt nvfp4 --backend cuda --mode $mode --T $T --reps 2 2>&1 | grep probe | tail -2; done; done; done
ROUNDS=2 PREFILL_T=1024,2048,4096,8192 lab/ab_wide.sh old:0 st12:0 amax:0 amax12:0
