#!/usr/bin/env bash
# Lab, on the device: Nsight Compute with per-instruction warp-stall sampling of one launch of a
# GEMM kernel, written as CSV (one row per SASS instruction: stall samples by reason) to $OUT, for
# reading the hot spots against the SASS here. Carry ["lab/bin", ".libs"]; bench = lab/bin/bench_new.
# Usage: lab/ncu_src.sh NAME KERNEL_REGEX SKIP BENCH_ARGS...
. "$(dirname "$0")/env.sh" /tmp/ncu
name=$1 kre=$2 skip=$3; shift 3
timeout 240 ncu --kernel-name regex:"$kre" --launch-skip "$skip" --launch-count 1 \
  --section SpeedOfLight --section WarpStateStats --section SourceCounters --section SchedulerStats \
  -o "/tmp/$name" -f lab/bin/bench_${BENCH:-new} "$@" > "/tmp/$name.log" 2>&1 || { tail -5 "/tmp/$name.log"; exit 1; }
ncu -i "/tmp/$name.ncu-rep" --page details 2>&1 | grep -E "k_|Duration|Throughput|Issued|Eligible|Warp Cycles" | head -12
ncu -i "/tmp/$name.ncu-rep" --page source --csv --print-source sass > "$out/$name.csv" 2> "/tmp/$name.err" || tail -3 "/tmp/$name.err"
echo "$name: $(wc -l < "$out/$name.csv") rows"
