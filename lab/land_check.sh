#!/usr/bin/env bash
# Lab, on the device, one call where device time is short: the whole GPU test program of the
# carried build (per-width max relL2 of test_wgmma_path), then the k_wgp width A/B of the
# carried cuda_moe_bench (lab/bin/bench_b = build/tests/tools/cuda_moe_bench), then the product table
# (tools/gpu-check without tests or sweeps) in what time is left. Usage: lab/land_check.sh
. "$(dirname "$0")/env.sh" /tmp/land
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
t0=$SECONDS
timeout ${TEST_TIMEOUT:-280} build/tests/test_cuda_moe > "$out/tests.log" 2>&1
echo "test_cuda_moe rc=$? ($((SECONDS - t0)) s)"
grep -E "FAILED|PASSED|SKIP|rror" "$out/tests.log" | head -12
awk -f lab/widths.awk "$out/tests.log"
mkdir -p lab/bin; [ -x lab/bin/bench_b ] || cp build/tests/tools/cuda_moe_bench lab/bin/bench_b
ROUNDS=${ROUNDS:-1} PREFILL_T=${PREFILL_T:-4096,6144,8192,12288} OUT=$out timeout ${AB_TIMEOUT:-200} lab/ab_wide.sh b:0 b:80 b:128 b:160
echo "== product table ($((SECONDS - t0)) s)"
OUT=$out timeout ${TABLE_TIMEOUT:-170} tools/gpu-check --skip-tests --skip-sweeps 2>&1 | tail -40
echo "total $((SECONDS - t0)) s"
