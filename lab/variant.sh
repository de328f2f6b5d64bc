#!/usr/bin/env bash
# Lab: a variant of the GPU MoE kernels for a same-call A/B on the device. Compiles one kernel
# file with extra -D flags (the #ifdef K3_LAB_* switches a lab session adds) and links it ahead
# of build/libk3.a into lab/bin/bench_NAME (and, with WITH_TEST=1, lab/bin/test_NAME), stripped
# for the device tool's 64 MiB carry. Run `make` first. lab/bin/ is git-ignored.
# Usage: [SRC=DIR] lab/variant.sh NAME [moe_run|moe_prefill|moe_prefill_ws] -DK3_LAB_X=1 ...
# SRC: a copy of src/ (only its cuda/ files needed) holding another version of the kernel files,
# e.g. a branch's, compiled against this tree's libk3.a (headers in SRC shadow src/).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; shift
unit=moe_run
case "${1:-}" in moe_run|moe_prefill|moe_prefill_ws) unit=$1; shift;; esac
CUDA_HOME=$(dirname "$(dirname "$(realpath "$(command -v nvcc)")")")
mkdir -p lab/bin
obj=$(mktemp --suffix=.o)
trap 'rm -f "$obj"' EXIT
src=${SRC:-src}
nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$src" -Isrc -Iinclude -Xcompiler -fPIC \
     --compress-mode=size "$@" -c -o "$obj" "$src/cuda/$unit.cu"
libs="build/libk3.a -L$CUDA_HOME/lib64 -lcudart_static -ldl -lrt -lstdc++ -lcjson -lpcre2-8 -lm -pthread"
cc -O2 -std=c11 -D_GNU_SOURCE -pthread -Iinclude -Isrc -DK3_HAVE_CUDA=1 -o lab/bin/bench_$name \
   tests/tools/cuda_moe_bench.c "$obj" $libs
strip lab/bin/bench_$name
if [ "${WITH_TEST:-0}" = 1 ]; then
  cc -O2 -std=c11 -D_GNU_SOURCE -pthread -Iinclude -Isrc -DK3_HAVE_CUDA=1 -o lab/bin/test_$name \
     tests/test_cuda_moe.c "$obj" -lcmocka $libs
  strip lab/bin/test_$name
  echo "lab/bin/test_$name"
fi
echo "lab/bin/bench_$name"
