#!/usr/bin/env bash
# The GPU bench in one call of the device tool (bench/gpu/README.md):
#   run(command="bash bench/gpu/run.sh", carry=[".whl"], timeout_s=600)
# Installs the wheels bench/gpu/fetch_wheels.sh put in .whl/ (TRL 1.16 and what the machine's image lacks), makes
# rlhfkit importable from this checkout, and runs bench/gpu/run.py's GPU plan; the table lands in $OUT (else
# bench/gpu/out/). Extra arguments go to run.py (e.g. --lengths 512 --shapes qwen3-1.7b).
set -u
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-bench/gpu/out}
start=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  echo "[run.sh] installed $(ls .whl/*.whl | wc -l) wheels in $(( $(date +%s) - start )) s"
else
  echo "[run.sh] no .whl/: using the installed packages (run bench/gpu/fetch_wheels.sh here, carry .whl)"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.max.sm,power.draw --format=csv 2>&1 | head -3
python3 bench/gpu/run.py --device cuda --out "$out" "$@"
rc=$?
echo "[run.sh] exit $rc after $(( $(date +%s) - start )) s"
exit $rc
