#!/usr/bin/env bash
# Lab, on the device: SM clock and board power sampled every 10 ms by nvidia-smi while one bench
# process runs the grouped backend with one k_wgp width pinned (long enough to cover many FC1 /
# FC2 phases), then a summary (min / median / max clock, median / max power over the busy
# samples) per run. Shows whether the prefill kernels run power-throttled.
# Carry ["lab/bin", ".libs"], bench = lab/bin/bench_${BENCH:-b}. Usage: lab/clocks.sh MODE:T:WGP ...
. "$(dirname "$0")/env.sh" /tmp/clocks
pick() { sort -n | awk '{v[NR] = $1} END {printf "min %5d median %5d max %5d", v[1], v[int(NR / 2) + 1], v[NR]}'; }
for spec in "$@"; do
  IFS=: read -r mode T wgp <<< "$spec"
  smi=$out/smi_${mode}_$T.csv
  nvidia-smi --query-gpu=clocks.sm,power.draw --format=csv,noheader,nounits -lms 10 > "$smi" &
  pid=$!
  sleep 0.3
  timeout 120 lab/bin/bench_${BENCH:-b} --fmt nvfp4 --backend cuda --mode "$mode" --T "$T" --reps ${REPS:-40} \
    --wgp "$wgp" > "$out/bench_${mode}_$T.tsv" 2>&1
  kill $pid; wait $pid 2> /dev/null
  busy=$(awk -F', ' '$2 + 0 > 200' "$smi")
  echo "$spec: $(wc -l <<< "$busy") busy samples; SM MHz $(cut -d, -f1 <<< "$busy" | pick); W $(cut -d, -f2 <<< "$busy" | pick)"
  awk '$1 == "k3" {print "   ", $4, $5, $12}' "$out/bench_${mode}_$T.tsv"
done
