#!/usr/bin/env bash
# Build a CPU-only Python environment in which the installed-SGLang engine (--engine sglang|both) runs,
# then run the engine comparison tests (pytest -m sglang) in it.
#
#   scripts/sglang_cpu_env.sh                 # build (or reuse) the venv, run the sglang test group
#   SGLANG_VENV=/tmp/sg scripts/sglang_cpu_env.sh -x -q   # extra args go to pytest
#   SGLANG_ENV_ONLY=1 scripts/sglang_cpu_env.sh           # build only; prints how to use it
#
# What it installs: sglang==0.5.23 WITHOUT its dependencies (they are the GPU serving stack: CUDA
# kernels, flashinfer, xgrammar, ...), plus the few packages its import of the argument resolution,
# model-config classes and pool-sizing modules needs. Two packages are replaced by import-only stubs
# (scripts/sglang_stubs, see its README): triton (1 GB, useless without a GPU, imported unconditionally)
# and torchvision (the PyPI wheels do not load against torch 2.13.0+cpu). The venv sees the system
# site-packages so an existing torch CPU build is reused; without one, torch is installed from the
# package index (pinned; TORCH_VERSION overrides).
#
# Never use this environment to SERVE: the stubs make every kernel a dummy. On a GPU host, run the
# checker in the deployment's own Python instead (it has the real SGLang).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"                       # the interpreter the venv is made from
SGLANG_VENV="${SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/pp-checker/sglang-0.5.23-cpu}"
SGLANG_VERSION=0.5.23
STUBS="$REPO/scripts/sglang_stubs"

# Exactly what `import` of the engine's SGLang modules needs, pinned to the versions it was built and
# tested with. --no-deps throughout: their own dependency lists would pull the GPU stack back in.
NO_DEPS=(
  "sglang==$SGLANG_VERSION"
  "transformers==5.19.0"            # sglang 0.5.23 pins it
  "huggingface_hub==2.4.0" "httpx2==2.16.2" "httpcore2==2.16.2" "h11==0.16.0" "truststore==0.10.5"
  "tokenizers==0.23.3" "safetensors==0.8.0" "sentencepiece==0.2.3"
  "psutil==7.2.2" "pybase64==1.5.1" "msgspec==0.22.0" "pyzmq==27.3.0" "tqdm==4.70.1" "dill==0.4.1"
  "starlette==1.10.0" "anyio==4.16.0" "typer==0.29.2"
  "aiohttp==3.14.5" "multidict==7.2.1" "yarl==1.25.1" "propcache==0.5.4" "frozenlist==1.8.0"
  "aiohappyeyeballs==2.7.1" "aiosignal==1.4.0"
  "apache-tvm-ffi==0.1.11" "compressed-tensors==0.20.1" "loguru==0.7.3" "gguf==0.19.0"
)
# Common pure-Python (or ubiquitous) packages; skipped by pip when the system already has them.
WITH_DEPS=(numpy orjson requests packaging pillow pyyaml regex filelock fsspec pydantic click jinja2 sympy
           pytest pytest-xdist hypothesis)

t0=$(date +%s)
if [[ ! -x "$SGLANG_VENV/bin/python" ]]; then
  echo "== creating $SGLANG_VENV (system site-packages visible, for torch)"
  "$PYTHON" -m venv --system-site-packages "$SGLANG_VENV"
fi
PY="$SGLANG_VENV/bin/python"
if ! "$PY" -c "import torch" 2>/dev/null; then
  # A pinned version: an unpinned torch pulls a multi-GB CUDA build from PyPI.
  echo "== no torch visible: installing torch ${TORCH_VERSION:-2.13.0}"
  "$PY" -m pip install -q "torch==${TORCH_VERSION:-2.13.0}"
fi
if [[ "$("$PY" -c 'import importlib.metadata as m; print(m.version("sglang"))' 2>/dev/null)" != "$SGLANG_VERSION" ]]; then
  echo "== installing sglang==$SGLANG_VERSION --no-deps and its import-time packages"
  "$PY" -m pip install -q --no-deps "${NO_DEPS[@]}"
  "$PY" -m pip install -q "${WITH_DEPS[@]}"
fi
t1=$(date +%s)
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "== environment ready in $((t1 - t0)) s; venv site-packages: $(du -sm "$site" | cut -f1) MB"

# The stubs go FIRST on the path, ahead of any real triton/torchvision the system may have.
export PYTHONPATH="$STUBS${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'EOF'
import importlib.metadata, time
t = time.time()
from checker.engines.sglang import SglangEngine
e = SglangEngine()
print(f"== SGLang {e.version} imports for the checker in {time.time() - t:.1f} s")
EOF

if [[ -n "${SGLANG_ENV_ONLY:-}" ]]; then
  echo "use it:  PYTHONPATH=$STUBS $PY -m checker derive --engine both ..."
  exit 0
fi
cd "$REPO"
echo "== pytest -m sglang tests/test_engine_sglang.py"
t2=$(date +%s)
status=0
"$PY" -m pytest tests/test_engine_sglang.py -m sglang -p no:cacheprovider -n 0 "$@" || status=$?
t3=$(date +%s)
echo "== tests: $((t3 - t2)) s; total: $((t3 - t0)) s"
exit $status
