#!/usr/bin/env bash
# link_check.sh BUILD_DIR — the pserver and pslaunch load only what they use: no CUDA,
# cuBLAS, NCCL or BLAS library (common/ is split into libraries by concept and these link
# pst_base alone: checked in ldd's list and in the link line; docs/design.md#layout). The trainer, in a CUDA build, does load them.
set -u
bin=$1/bin
fail=0
for p in pserver pslaunch; do
  bad=$(ldd "$bin/$p" | grep -E -i 'libcuda|libcublas|libnccl|blas|libgfortran' || true)
  if [ -n "$bad" ]; then
    echo "link_check: $p loads libraries it should not need:"
    echo "$bad"
    fail=1
  fi
done
# The linker's --as-needed would drop unused libraries from ldd's list even if the link
# line named them: the link line itself must not (Makefile generator: link.txt).
for p in pserver/CMakeFiles/pserver.dir trainer/CMakeFiles/pslaunch.dir; do
  f=$1/$p/link.txt
  [ -f "$f" ] || continue
  bad=$(tr ' ' '\n' <"$f" | grep -E -i 'cuda|cublas|nccl|blas|pst_(nn|runtime|data)' || true)
  if [ -n "$bad" ]; then
    echo "link_check: $f names:"
    echo "$bad"
    fail=1
  fi
done
[ $fail = 0 ] && echo "link_check: pserver and pslaunch load no CUDA, cuBLAS, NCCL or BLAS library"
exit $fail
