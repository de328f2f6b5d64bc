#!/usr/bin/env bash
# Lab, on the device: one call for both pending patches (lab/NOTES.md "Next" 0), most informative
# first (a call may be cut at 600 s): the fused-stream variants at decode sizes with their phase
# stamps, fs6's tests, the sw128 prefill A/B at the automatic path, sw128's wgmma tests.
# Binaries: lab/bin/bench_{main,fs5,fs6,fs7,fs6np,fs6f,fs6fp,sw128}, test_{fs6,fs6f,sw128}. Raw TSV
# under $OUT, and the printed lines in $OUT/log.txt as they come (a call cut at its limit keeps them).
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp/ab}; mkdir -p "$out"
t0=$SECONDS
exec > >(tee "$out/log.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
for round in 1 2; do
  names="main fs6 fs6f fs6fp fs5 fs7 fs6np"; [ $round = 2 ] && names="fs6fp fs6f fs6 fs7 fs5 main"
  for n in $names; do
    timeout 40 lab/bin/bench_$n --fmt nvfp4 --backend cuda-fused --T 1,2,4,8 --reps 30 > /tmp/abf.tsv 2>&1
    { echo "## $round $n"; cat /tmp/abf.tsv; } >> "$out/fused.tsv"
    awk -v n=$n -v r=$round '$1 == "k3" {printf "r%s %-6s fused T=%-3s %8.1f us %5.3f of floor  stages %s\n", r, n, $4, $5, $10, $12}' /tmp/abf.tsv
  done
done
timeout 40 lab/bin/bench_main --fmt nvfp4 --backend cuda --T 1,8 --reps 30 | awk '$1 == "k3" {printf "grouped main T=%-3s %8.1f us %5.3f of floor  stages %s\n", $4, $5, $10, $12}'
echo "fused done $((SECONDS - t0)) s"
for v in fs6f fs6; do
fl="test_nvfp4_situ_all_T test_ep_rank_subsets test_all_tokens_one_expert_and_empty_experts test_mxfp4_situ_all_T
    test_activations_both_formats test_w4a4_nvfp4 test_w4a16_bf16 test_larger_shape test_explicit_errors"
[ $v = fs6 ] && fl="test_nvfp4_situ_all_T test_ep_rank_subsets test_explicit_errors"
for f in $fl; do
  K3_CUDA_TEST_FILTER=$f timeout 60 stdbuf -oL lab/bin/test_$v > /tmp/t.log 2>&1
  rc=$?; echo "test_$v $f rc=$rc ($((SECONDS - t0)) s)"; grep -E "FAILED|rror" /tmp/t.log | head -3
  [ $rc = 0 ] || cp /tmp/t.log "$out/test_${v}_$f.log"
done
if [ $v = fs6f ]; then
  K3_CUDA_TEST_FILTER=test_ep_rank_subsets timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
    lab/bin/test_fs6f > "$out/memcheck_fs6f.log" 2>&1
  echo "memcheck test_fs6f test_ep_rank_subsets rc=$? ($((SECONDS - t0)) s)"; grep -E "ERROR SUMMARY" "$out/memcheck_fs6f.log"
fi
done
for mode in w4a16 w4a16-bf16; do
  for n in main sw128; do
    timeout 60 lab/bin/bench_$n --fmt nvfp4 --backend cuda --mode $mode --T 2048,4096,8192 --reps 5 > /tmp/abp.tsv 2>&1
    { echo "## $n $mode"; cat /tmp/abp.tsv; } >> "$out/prefill.tsv"
    awk -v n=$n '$1 == "k3" {printf "%-6s %-10s T=%-5s %9.1f us %6.1f TF  %s\n", n, $13, $4, $5, $11, $12}' /tmp/abp.tsv
  done
done
echo "prefill done $((SECONDS - t0)) s"
K3_CUDA_TEST_FILTER=test_wgmma_path timeout 200 stdbuf -oL lab/bin/test_sw128 > "$out/test_sw128.log" 2>&1
echo "test_sw128 test_wgmma_path rc=$? ($((SECONDS - t0)) s)"; grep -E "FAILED|rror|PASSED" "$out/test_sw128.log" | head -4
