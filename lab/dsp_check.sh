#!/usr/bin/env bash
# Lab, on the device (lab/bin and .libs carried): lab/pending/small_stages.patch in one call
# (lab/NOTES.md v37): the dispatch over many blocks (k_prep + k_scatter), h in bf16 on the k_wgp
# path in w4a16-bf16, the float4 finalize. Binaries, built here (nvcc on PATH; each build ~4 min):
#   make -j2 && cp build/tests/tools/cuda_moe_bench lab/bin/bench_old
#   git apply lab/pending/small_stages.patch && make -j2
#   cp build/tests/tools/cuda_moe_bench lab/bin/bench_new && cp build/tests/test_cuda_moe lab/bin/test_new
#   and, optional, xc (lab/pending/fc2_xconv.patch on top: FC2's producer converts the bf16 rows,
#   no hconv): git apply lab/pending/fc2_xconv.patch && make -j2, then bench_xc / test_xc likewise
#   strip lab/bin/*; ar t build/libk3.a | grep cuda_absent (must print nothing)
# Prints a T = 8 smoke per binary, the stage A/B (prep, fc1, hconv, fc2, finalize us), then as
# much of the whole GPU test of the patched tree as PART2_S seconds allow (`PART2_S=330`), and
# with MEMCHECK_S=150 the quick test under compute-sanitizer first.
. "$(dirname "$0")/env.sh" /tmp/dsp; OUT=$out
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
NAMES="old new"; [ -x lab/bin/bench_xc ] && NAMES="old new xc"
for n in $NAMES; do echo "smoke $n $(timeout 30 lab/bin/bench_$n --fmt nvfp4 --backend cuda --mode w4a16 --T 8 --reps 2 2>&1 | awk '$1=="k3"{print $4,$5} /rror/' | head -2)"; done
t0=$SECONDS
for mode in ${MODES:-w4a16-bf16 w4a16}; do
  for round in $(seq ${ROUNDS:-2}); do
    for n in $NAMES; do
      timeout 120 lab/bin/bench_$n --fmt nvfp4 --backend cuda --mode $mode --T ${TS:-8,256,2048,8192} --reps 5 > /tmp/dsp_run.tsv 2>&1
      { echo "## $n $mode round $round"; cat /tmp/dsp_run.tsv; } >> "$OUT/ab.tsv"
      awk -v n=$n '$1 == "k3" {printf "%-4s %-10s T=%-5s %9.1f us  %.3f of floor  stages %s\n", n, $13, $4, $5, $10, $12}' /tmp/dsp_run.tsv
      grep -iE "error|fail" /tmp/dsp_run.tsv | head -2
    done
  done
done
echo "bench $((SECONDS - t0)) s"
TEST=${TEST:-new}  # TEST=xc: the tests and the memcheck of the xc build
if [ -n "${MEMCHECK_S:-}" ]; then  # the quick whole GPU test under compute-sanitizer (~100 s in v36)
  K3_CUDA_TEST_QUICK=1 timeout $MEMCHECK_S compute-sanitizer --tool memcheck --error-exitcode 9 lab/bin/test_$TEST \
    > $OUT/memcheck.log 2>&1; echo "memcheck test_$TEST rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -5
fi
if [ -n "${PART2_S:-}" ]; then
  timeout $PART2_S lab/bin/test_$TEST > $OUT/test_$TEST.log 2>&1; echo "test_$TEST rc=$?"
  grep -E "^\[  (PASSED|FAILED) \]|FAILED|rror|one expert T=9000|T=2500" $OUT/test_$TEST.log | head -20
fi
