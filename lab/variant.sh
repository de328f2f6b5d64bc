#!/usr/bin/env bash
# Lab: a variant of the GPU MoE kernels for a same-call A/B on the device. Compiles kernel files
# with extra -D flags (the #ifdef K3_LAB_* switches a lab session adds) and links them ahead of
# build/libk3.a into lab/bin/bench_NAME (and, with WITH_TEST=1, lab/bin/test_NAME), stripped
# for the device tool's 64 MiB carry. Run `make` first. lab/bin/ is git-ignored.
# Usage: [SRC=DIR | PATCH=FILE] lab/variant.sh NAME [UNIT[,UNIT...]] -DK3_LAB_X=1 ...
#   UNIT: moe_run, moe_prefill or moe_prefill_ws (default moe_run); a comma list compiles each.
#   SRC: a copy of src/ (only its cuda/ files needed) holding another version of the kernel files,
#   e.g. a branch's, compiled against this tree's libk3.a (headers in SRC shadow src/).
#   PATCH: a diff against this tree (lab/pending/*.patch, `git diff` form) applied to a copy of
#   src/ that is then used as SRC.
#   TEST_C: the GPU test source for WITH_TEST=1 (default tests/test_cuda_moe.c), e.g. a branch's.
# Fails, as the Makefile does, when ptxas reports a serialized wgmma (C7512 or C7514: tools/nvcc-checked);
# NVCC_CHECK=0 skips that check (a probe whose counters cost the registers, lab/epi_check.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; shift
units=moe_run
case "${1:-}" in moe_run*|moe_prefill*) units=$1; shift;; esac
CUDA_HOME=$(dirname "$(dirname "$(realpath "$(command -v nvcc)")")")
mkdir -p lab/bin
if ar t build/libk3.a | grep cuda_absent > /dev/null; then  # (grep -q could end ar by SIGPIPE: pipefail)
  echo "variant.sh: build/libk3.a holds cuda_absent.o (a build without nvcc): run make with nvcc on PATH" >&2; exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=${SRC:-src}
if [ -n "${PATCH:-}" ]; then
  mkdir -p "$tmp/tree"
  cp -r src "$tmp/tree/src"
  patch -s -d "$tmp/tree" -p1 < "$PATCH"
  src=$tmp/tree/src
fi
check=tools/nvcc-checked
[ "${NVCC_CHECK:-1}" = 0 ] && check=
objs=()
for unit in ${units//,/ }; do
  case $unit in moe_run|moe_prefill|moe_prefill_ws) ;; *) echo "variant.sh: unknown unit $unit" >&2; exit 2;; esac
  $check nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I"$src" -Isrc -Iinclude \
       -Xcompiler -fPIC --compress-mode=size "$@" -c -o "$tmp/$unit.o" "$src/cuda/$unit.cu"
  objs+=("$tmp/$unit.o")
done
libs="build/libk3.a -L$CUDA_HOME/lib64 -lcudart_static -ldl -lrt -lstdc++ -lcjson -lpcre2-8 -lm -pthread"
cc -O2 -std=c11 -D_GNU_SOURCE -pthread -Iinclude -Isrc -DK3_HAVE_CUDA=1 -o lab/bin/bench_$name \
   tests/tools/cuda_moe_bench.c "${objs[@]}" $libs
strip lab/bin/bench_$name
if [ "${WITH_TEST:-0}" = 1 ]; then
  cc -O2 -std=c11 -D_GNU_SOURCE -pthread -Iinclude -Isrc -DK3_HAVE_CUDA=1 -o lab/bin/test_$name \
     "${TEST_C:-tests/test_cuda_moe.c}" "${objs[@]}" -lcmocka $libs
  strip lab/bin/test_$name
  echo "lab/bin/test_$name"
fi
echo "lab/bin/bench_$name"
