#!/usr/bin/env bash
# Lab, on the device: a same-call A/B of lab/bin/bench_NAME binaries (lab/variant.sh builds them;
# bench_main is a stripped copy of build/tests/tools/cuda_moe_bench made before the change).
# Usage: TESTS="new qpf" lab/ab.sh NAME... (carry ["lab/bin", ".libs"])
#   TESTS: lab/bin/test_NAME binaries to run first (the GPU tests, TEST_TIMEOUT s each, default
#   300), the first one also under compute-sanitizer memcheck (the expert-parallel test: grouped
#   and fused).
#   FUSED_T / GROUPED_T: the token counts of the fused and grouped runs (grouped only NVFP4 and
#   MXFP4 of the first and last NAME, or of GROUPED_NAMES; GROUPED_MODES: modes, default w4a16).
#   Two rounds, the second in reverse order.
. "$(dirname "$0")/env.sh" /tmp/ab
b=lab/bin
t0=$SECONDS
exec > >(tee "$out/log.txt") 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
first=1
for t in ${TESTS:-}; do
  timeout ${TEST_TIMEOUT:-300} $b/test_$t > "$out/test_$t.log" 2>&1
  echo "test_$t rc=$? ($((SECONDS - t0)) s)"; grep -E "PASSED|FAILED" "$out/test_$t.log" | head -5
  if [ $first = 1 ]; then
    K3_CUDA_TEST_FILTER=test_ep_rank_subsets timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
      $b/test_$t > "$out/memcheck_$t.log" 2>&1
    echo "memcheck test_$t rc=$? ($((SECONDS - t0)) s)"; grep -E "ERROR SUMMARY" "$out/memcheck_$t.log"
    first=0
  fi
done
names=("$@")
rev=(); for ((i = ${#names[@]} - 1; i >= 0; i--)); do rev+=("${names[$i]}"); done
gnames=${GROUPED_NAMES:-"${names[0]} ${names[${#names[@]}-1]}"}
for r in 1 2; do
  if [ $r = 1 ]; then ns=("${names[@]}"); else ns=("${rev[@]}"); fi
  for n in "${ns[@]}"; do
    timeout 60 $b/bench_$n --fmt nvfp4 --backend cuda-fused --T ${FUSED_T:-1,2,4,8,64} --reps 30 |
      awk -v n=$n -v r=$r '$1 == "k3" {printf "r%s %-5s fused   %s T=%-3s %8.1f us %5.3f of floor  stages %s\n", r, n, $3, $4, $5, $10, $12}'
  done
  for n in $gnames; do
    for f in nvfp4 mxfp4; do
      for mo in ${GROUPED_MODES:-w4a16}; do
        timeout 60 $b/bench_$n --fmt $f --backend cuda --mode $mo --T ${GROUPED_T:-1,8,64,256} --reps 10 |
          awk -v n=$n -v r=$r -v mo=$mo '$1 == "k3" {printf "r%s %-6s grouped %s %-10s T=%-3s %8.1f us %5.3f of floor  stages %s\n", r, n, $3, mo, $4, $5, $10, $12}'
      done
    done
  done
done
echo "done $((SECONDS - t0)) s"
