#!/usr/bin/env bash
# Lab: stage this worktree (with its build/ and the cmocka runtime) into /work/main/.gpu-stage,
# the git-ignored folder the device tool carries.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
dst=/work/main/.gpu-stage
rm -rf "$dst"; mkdir -p "$dst"
tar -C "$src" --exclude=./.git -cf - . | tar -C "$dst" -xf -
mkdir -p "$dst/.libs"
cp -L /lib/x86_64-linux-gnu/libcmocka.so.0 "$dst/.libs/"
du -sh "$dst"
