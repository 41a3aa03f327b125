#!/usr/bin/env bash
# weft for the device machine (Python 3.12, CUDA 13): the package with its _weft module, the NCCL
# executor's C++ tests, and the shared libraries the device image lacks (CBC, fmt, BLAS...).
set -euo pipefail
cd "$(dirname "$0")/.."
B=build/gpu_bundle; rm -rf $B; mkdir -p $B/site $B/lib $B/bin
cp -r python/weft $B/site/ && find $B/site -name __pycache__ -prune -exec rm -rf {} +
cp build/gpu/python/_weft*.so $B/site/weft/
cp build/gpu/tests/cpp/weft_test_exec $B/bin/
for f in $(ldd build/gpu/python/_weft*.so build/gpu/tests/cpp/weft_test_exec | awk '/=>/ {print $3}' | sort -u); do
  case $(basename $f) in
    libc.so*|libm.so*|libstdc++*|libgcc_s*|ld-linux*|libpthread*|libdl.so*|librt.so*|libnccl*|libcuda.so*) ;;
    *) cp -L $f $B/lib/ ;;
  esac
done
du -sh $B $B/lib; ls $B/lib
