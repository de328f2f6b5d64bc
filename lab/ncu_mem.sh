#!/usr/bin/env bash
# Lab, on the device: Nsight Compute's memory tables (L1 / L2 hit rates, sectors and bytes by
# unit, DRAM) for one launch of a GEMM kernel, as text in $OUT/NAME.txt. Carry ["lab/bin", ".libs"].
# Usage: lab/ncu_mem.sh NAME KERNEL_REGEX SKIP BENCH_ARGS...   (bench = lab/bin/bench_${BENCH:-b})
. "$(dirname "$0")/env.sh" /tmp/ncu
name=$1 kre=$2 skip=$3; shift 3
timeout 240 ncu --kernel-name regex:"$kre" --launch-skip "$skip" --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  -o "/tmp/$name" -f lab/bin/bench_${BENCH:-b} "$@" > "/tmp/$name.log" 2>&1 || { tail -5 "/tmp/$name.log"; exit 1; }
ncu -i "/tmp/$name.ncu-rep" --page details --print-details all > "$out/$name.txt" 2>&1
ncu -i "/tmp/$name.ncu-rep" --page raw --csv 2> /dev/null > "$out/$name.raw.csv"
grep -E "Hit Rate|Throughput|Duration|Memory \[%\]|Mem Busy|Max Bandwidth|L2 Compression|DRAM" "$out/$name.txt" | head -20
