#!/usr/bin/env bash
# Download, here, the wheels bench/gpu/run.sh installs on the GPU machine (which cannot reach a registry) into .whl/
# (git-ignored through .git/info/exclude, never committed; carried with the device call: carry=[".whl"]).
# What the machine's image lacks or holds at another version (/work/.library/device/KINDS.md, 2026-11: torch 2.11,
# transformers 5.17, accelerate 1.15, peft, pyarrow, pandas, huggingface-hub 1.33 there; no datasets, no TRL):
#   trl 1.16.0          the peer arm (what bench/settings.py pins for GRPO)
#   transformers 5.24.0 the version rlhfkit and TRL run with here (the image's 5.17 is older)
#   datasets 5.2.0      both libraries import it; with dill and multiprocess, its requirements missing there
# Python 3.12 (the machine's), x86-64 manylinux; --no-deps: each requirement is named here.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
mkdir -p .whl
rm -f .whl/*.whl  # one version of each: two stop the whole install there
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  trl==1.16.0 transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
ls -l .whl
du -cb .whl/*.whl | tail -1 | awk '{printf "%.1f MB of wheels (the working tree travels with them: 64 MiB in all)\n", $1 / 1e6}'
git check-ignore -q .whl/ && echo ".whl/ is git-ignored"
