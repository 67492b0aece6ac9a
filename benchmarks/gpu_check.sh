#!/usr/bin/env bash
# GPU check of the spectra engine, for one run on a CUDA machine (about 8 minutes at most).
# Installs nothing: needs python3 with a CUDA build of torch, numpy, pytest (and transformers
# for the whole-model cases, skipped without it). Run from the repository root:
#     bash benchmarks/gpu_check.sh            # logs go to $OUT when set, else ./gpu_check_logs
# 1. the gpu-marked tests: CUDA results equal to the CPU's within the accuracy bound;
# 2. the engine benchmark with --device cuda --full --models (each step under a time limit).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
LOGS="${OUT:-$PWD/gpu_check_logs}"
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$LOGS/summary.txt"; }

stamp "device: $($PY -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA")' 2>&1)"
date -u | tee -a "$LOGS/summary.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$LOGS/nvidia_smi.txt" 2>&1 || true

stamp "1. gpu tests"
timeout 150 $PY -m pytest -q -m gpu tests/test_engine_paths.py -p no:cacheprovider > "$LOGS/gpu_tests.log" 2>&1
stamp "   exit $? ; $(tail -n 1 "$LOGS/gpu_tests.log")"

stamp "2. engine benchmark: factored, dense, Mamba layer (--device cuda --full)"
timeout 200 $PY benchmarks/bench_engine.py --device cuda --full > "$LOGS/bench_engine.log" 2>&1
stamp "   exit $?"
cat "$LOGS/bench_engine.log"

if $PY -c "import transformers" 2>/dev/null; then
  stamp "3. whole models (GPT-2-small, Mamba-130m shaped) at L = 512, 1024"
  timeout 180 $PY benchmarks/bench_engine.py --device cuda --models-only > "$LOGS/bench_models.log" 2>&1
  stamp "   exit $?"
  cat "$LOGS/bench_models.log"
else
  stamp "3. whole models: skipped (transformers is not installed)"
fi
stamp "done; logs in $LOGS"
