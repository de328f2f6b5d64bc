#!/usr/bin/env bash
# Lab, on the device: the shared-memory weight ring of the mma.sync tiles (gemm_tile RS > 0)
# against the register pipeline, most informative first (a call may be cut at its limit):
# fused T = 1 / 2 / 4 (the K-halves path), grouped decode sizes, then the ring builds' tests and
# a memcheck; the product build's own GPU tests and a memcheck come first.
# Also the fused kernel without its dispatch barrier (FUSED_LOCAL: every CTA dispatches for
# itself, FC1 units wait only for their tokens' x rows).
# Binaries (PATCH=lab/pending/ring.patch lab/variant.sh): bench_main (the tree), bench_ring3
# (FC_RS = FUSED_RS = 3), bench_ring3m7 (FC_RS 2, FUSED_RS 3, FUSED_MINB 7), bench_ring4m5 (RS 4,
# FUSED_MINB 5), bench_loc0 (FUSED_LOCAL, RS 0), bench_loc3 (FUSED_LOCAL, RS 3), and test_ring3,
# test_loc0, test_loc3; test_main is the tree's build/tests/test_cuda_moe, stripped. Raw TSV under $OUT, the printed lines in $OUT/log.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH=$PWD/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
out=${OUT:-/tmp/ab}; mkdir -p "$out"
t0=$SECONDS
exec > >(tee "$out/log.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
# the tree's own build first: the landed fused kernel has not run as one binary yet
timeout 200 lab/bin/test_main > "$out/test_cuda_moe.log" 2>&1
echo "test_main (the tree) rc=$? ($((SECONDS - t0)) s)"; grep -E "FAILED|PASSED|SKIPPED" "$out/test_cuda_moe.log" | head -5
K3_CUDA_TEST_FILTER=test_ep_rank_subsets timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
  lab/bin/test_main > "$out/memcheck_main.log" 2>&1
echo "memcheck test_main test_ep_rank_subsets rc=$? ($((SECONDS - t0)) s)"; grep -E "ERROR SUMMARY" "$out/memcheck_main.log"
for round in 1 2; do
  names="main ring3 loc0 loc3 ring3m7 ring4m5"; [ $round = 2 ] && names="ring4m5 ring3m7 loc3 loc0 ring3 main"
  for n in $names; do
    timeout 40 lab/bin/bench_$n --fmt nvfp4 --backend cuda-fused --T 1,2,4 --reps 30 > /tmp/abf.tsv 2>&1
    { echo "## $round $n"; cat /tmp/abf.tsv; } >> "$out/fused.tsv"
    awk -v n=$n -v r=$round '$1 == "k3" {printf "r%s %-8s fused   T=%-3s %8.1f us %5.3f of floor  stages %s\n", r, n, $4, $5, $10, $12}' /tmp/abf.tsv
  done
done
echo "fused done $((SECONDS - t0)) s"
for round in 1 2; do
  names="main ring3 ring3m7 ring4m5"; [ $round = 2 ] && names="ring4m5 ring3m7 ring3 main"
  for n in $names; do
    timeout 60 lab/bin/bench_$n --fmt both --backend cuda --T 1,8,64,256 --reps 10 > /tmp/abg.tsv 2>&1
    { echo "## $round $n"; cat /tmp/abg.tsv; } >> "$out/grouped.tsv"
    awk -v n=$n -v r=$round '$1 == "k3" {printf "r%s %-8s %-6s T=%-3s %8.1f us %5.3f of floor\n", r, n, $2, $4, $5, $10}' /tmp/abg.tsv
    timeout 60 lab/bin/bench_$n --fmt nvfp4 --backend cuda --mode w4a16-bf16 --T 256 --reps 10 > /tmp/abg.tsv 2>&1
    awk -v n=$n -v r=$round '$1 == "k3" {printf "r%s %-8s bf16   T=%-3s %8.1f us %5.3f of floor\n", r, n, $4, $5, $10}' /tmp/abg.tsv
  done
done
echo "grouped done $((SECONDS - t0)) s"
for v in loc3 ring3 loc0; do
  fl="test_nvfp4_situ_all_T test_ep_rank_subsets test_mxfp4_situ_all_T test_all_tokens_one_expert_and_empty_experts
      test_activations_both_formats test_w4a4_nvfp4 test_w4a16_bf16 test_larger_shape"
  [ $v = loc0 ] && fl="test_nvfp4_situ_all_T test_ep_rank_subsets"
  for f in $fl; do
    K3_CUDA_TEST_FILTER=$f timeout 90 stdbuf -oL lab/bin/test_$v > /tmp/t.log 2>&1
    rc=$?; echo "test_$v $f rc=$rc ($((SECONDS - t0)) s)"; grep -E "FAILED|rror" /tmp/t.log | head -3
    [ $rc = 0 ] || cp /tmp/t.log "$out/test_${v}_$f.log"
  done
  if [ $v = loc3 ]; then
    K3_CUDA_TEST_FILTER=test_ep_rank_subsets timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
      lab/bin/test_loc3 > "$out/memcheck_loc3.log" 2>&1
    echo "memcheck test_loc3 test_ep_rank_subsets rc=$? ($((SECONDS - t0)) s)"; grep -E "ERROR SUMMARY" "$out/memcheck_loc3.log"
  fi
done
