#!/usr/bin/env bash
# The GPU checks, run on the device machine over the working tree: weft built here for its Python 3.12
# and CUDA 13 by scripts/device_bundle.sh (build/gpu_bundle), then the NCCL executor tests, the torch
# runtime on NCCL, `weft calibrate` on the GPU and the GPT-1.3B runtime benchmark; results in $OUT.
# The timeouts sum to 540 s: one device call of 570 s runs it all.
B=$PWD/build/gpu_bundle
NCCL_LIB=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0] + '/lib')" 2>/dev/null)
export PYTHONPATH=$B/site
export LD_LIBRARY_PATH=$B/lib:$NCCL_LIB:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
L=$OUT/gpu.txt
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; echo "nccl lib: $NCCL_LIB";
  python3 -c "import weft, torch; print('weft imports; torch', torch.__version__, torch.cuda.get_device_name(0))"; } >>$L 2>&1
echo "== C++ NCCL executor tests" >>$L
timeout 60 $B/bin/weft_test_exec -tc="nccl*" >>$L 2>&1; echo "rc=$?" >>$L
echo "== pytest: torch runtime on NCCL" >>$L
timeout 70 python3 -m pytest -q -p no:cacheprovider tests/python/test_runtime.py -k "nccl" >>$L 2>&1; echo "rc=$?" >>$L
echo "== pytest: a module's own values on NCCL (in the program's value file, and from the user's file)" >>$L
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/python/test_module_values.py -k "nccl" >>$L 2>&1; echo "rc=$?" >>$L
echo "== pytest: weft.Trainer on NCCL (one GPU, f64, equal to torch AdamW + clipping + LambdaLR)" >>$L
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/python/test_trainer.py -k "nccl" >>$L 2>&1; echo "rc=$?" >>$L
echo "== calibrate (cuda, 1 GPU)" >>$L
[ -n "${SKIP_CALIBRATE:-}" ] && echo "skipped (SKIP_CALIBRATE)" >>$L || timeout 90 python3 -m weft.cli calibrate --device cuda --nproc 1 --out $OUT/h200_calibration.json --report $OUT/h200_report.json >$OUT/calibrate.txt 2>&1; echo "rc=$?" >>$L
tail -25 $OUT/calibrate.txt >>$L
echo "== bench_runtime 1.3B bf16" >>$L
timeout 200 python3 benchmarks/runtime/bench_runtime.py --device cuda --preset 1.3B --dtype bf16 --steps 5 >$OUT/bench_13b.txt 2>&1; echo "rc=$?" >>$L
tail -25 $OUT/bench_13b.txt >>$L
cat $L
