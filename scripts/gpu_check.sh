#!/bin/bash
# The GPU paths in one pass, on a lent GPU machine that has PyTorch but no network (BENCHMARKS.md, "GPU paths").
# What that machine's image lacks travels with the working tree, prepared here first:
#   .whl/   cp312 wheels of the project's dependencies missing there (TRL, transformers, datasets, LangGraph,
#           pydantic, sqlite-utils, GitPython, reasoning-gym and their needs), each fetched with
#           pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ... NAME==VERSION
#           at the versions of this venv (`pip freeze`); pure-Python sdists built here with `pip wheel --no-deps`
#   .deb/   bubblewrap_*.deb and libcap2_*.deb (`apt-get download bubblewrap libcap2`), unpacked under /tmp there;
#           .deb/sdist/pycosat-*.tar.gz (a C extension reasoning-gym needs, built there)
# Both folders are git-ignored locally (.git/info/exclude) and named in the run's carry. Results go to $OUT/log.txt.
export PYTHONUNBUFFERED=1
: "${OUT:=/tmp/gpu-check}"; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - t0 ))s] $*"; }
step setup
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site \
    .deb/sdist/pycosat-*.tar.gz || echo "pycosat did not build: the reasoning family will not import"
export PYTHONPATH=/tmp/site:$PWD EVOTRAINER_HOME=/tmp/evohome
if ! command -v bwrap >/dev/null; then
    mkdir -p /tmp/bw && for f in .deb/*.deb; do dpkg -x "$f" /tmp/bw; done
    export PATH=$PATH:/tmp/bw/usr/bin LD_LIBRARY_PATH=/tmp/bw/lib/x86_64-linux-gnu:/tmp/bw/usr/lib/x86_64-linux-gnu
fi
bwrap --ro-bind / / true && echo "bwrap works"
git config --global user.email gpu@check; git config --global user.name gpu-check
python3 -c "import torch, transformers, trl; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'bf16', torch.cuda.is_bf16_supported(), 'transformers', transformers.__version__, 'trl', trl.__version__)"
step "1 tests/test_gpu.py and the rung-1 agreement on CUDA"
timeout 150 python3 -m pytest tests/test_gpu.py tests/test_grpo_fast.py tests/test_policy.py tests/test_chat_checkpoint.py \
    -q -rfs --tb=short -p no:cacheprovider --timeout 100 -k "bf16 or autocast or rung1 or agree or draws_exactly" 2>&1 | tail -40
step "2 ladder rungs 1,2 on CUDA"
timeout 150 python3 -m harness.cli bench ladder --rungs 1,2 --out "$OUT/lad" 2>&1 | grep -v "^  " | tail -25
step "3 a tiny loop end to end on CUDA"
timeout 90 python3 -m pytest tests/test_run.py -q -rfs --tb=short -p no:cacheprovider --timeout 80 -k tiny_run_end_to_end 2>&1 | tail -15
step done
