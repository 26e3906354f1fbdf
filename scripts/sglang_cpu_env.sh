#!/usr/bin/env bash
# Build CPU-only environments in which the installed-SGLang engine (--engine sglang|both) runs the code of
# several SGLang releases, then run the engine comparison tests (pytest -m sglang) against each release.
#
#   scripts/sglang_cpu_env.sh                          # one release per sizing group (CI); test each
#   SGLANG_RELEASES=all scripts/sglang_cpu_env.sh       # every supported release, 0.5.10 .. 0.5.23
#   SGLANG_RELEASES="0.5.18" scripts/sglang_cpu_env.sh -x -q   # extra args go to pytest
#   SGLANG_ENV_ONLY=1 scripts/sglang_cpu_env.sh         # build only; prints how to use each release
#
# Layout (under SGLANG_CPU_HOME, default ~/.cache/pp-checker/sglang-cpu, kept between runs):
#   venv/            ONE venv (system site-packages visible, for torch) with the import-time packages every
#                    release shares, installed --no-deps and pinned;
#   releases/X/      `pip install --no-deps --target` of sglang==X plus the transformers/tokenizers that
#                    release pins (each wheel's Requires-Dist: 0.5.10 transformers 5.3.0, 0.5.11-0.5.12.post1
#                    5.6.0, 0.5.13-0.5.14 5.8.1, 0.5.15-0.5.21 5.12.1, 0.5.22+ 5.19.0; a later transformers
#                    clashes with their config registry: "'qwen3_asr' is already used by a Transformers
#                    config").
# A release is used by putting its folder (after the stubs) first on PYTHONPATH (0.5.10-0.5.12.post1 also
# scripts/sglang_stubs/kernel first; SGLANG_ENV_ONLY=1 prints each release's line):
#   PYTHONPATH=scripts/sglang_stubs:$SGLANG_CPU_HOME/releases/X  $SGLANG_CPU_HOME/venv/bin/python -m checker ...
# Downloads go through pip's own cache (PIP_CACHE_DIR, default ~/.cache/pip), so a rebuild after the
# folders are deleted does not download again; an existing, complete release folder is reused as is.
#
# Triton and torchvision are replaced by import-only stubs (scripts/sglang_stubs, see its README): triton
# is 1 GB and useless without a GPU; torchvision's PyPI wheels do not load against torch 2.13.0+cpu.
#
# Never use these environments to SERVE: the stubs make every kernel a dummy. On a GPU host, run the
# checker in the deployment's own Python instead (it has the real SGLang).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
HOME_DIR="${SGLANG_CPU_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/pp-checker/sglang-cpu}"
VENV="$HOME_DIR/venv"
STUBS="$REPO/scripts/sglang_stubs"
# Every release the engine runs (checker/engines/sglang.py FIRST_SUPPORTED onward; 0.5.9 and older compute
# the slots per request and the request cap inline in init_memory_pool, which the engine cannot call).
ALL_RELEASES=(0.5.10 0.5.10.post1 0.5.11 0.5.12 0.5.12.post1 0.5.13 0.5.13.post1 0.5.14 0.5.15 0.5.15.post1
              0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22 0.5.23)
# CI: one release of each sizing group whose code differs (checker/core/releases.py groups; the engine's
# adapters in checker/engines/sglang.py): 0.5.10-0.5.12.post1 (ModelRunner mixin, self.pp_size), 0.5.13
# (joint spec solve, lazy strategy, self.ps.pp_size), 0.5.14-0.5.15.post1 (last mixin, both strategy
# names), 0.5.16 (KVCacheConfigurator, budget pre-capture), 0.5.17 (max-share, padding slot), 0.5.18-0.5.21
# (resolve_once and the published context: 0.5.20), 0.5.22 (per-slot extra state, create_context),
# 0.5.23 (the max(1, ...) floors). docs/engine.md gives the cold and warm cost.
DEFAULT_RELEASES=(0.5.10 0.5.13 0.5.15 0.5.16 0.5.17 0.5.20 0.5.22 0.5.23)
case "${SGLANG_RELEASES:-}" in
  "") RELEASES=("${DEFAULT_RELEASES[@]}") ;;
  all) RELEASES=("${ALL_RELEASES[@]}") ;;
  *) read -r -a RELEASES <<<"$SGLANG_RELEASES" ;;
esac

# What a release pins that differs between releases (from each wheel's Requires-Dist); --target folder.
release_pins() {
  local hub="tokenizers==0.22.2 huggingface_hub==1.16.0"
  case "$1" in
    0.5.10*) echo "transformers==5.3.0 $hub" ;;
    0.5.11* | 0.5.12*) echo "transformers==5.6.0 $hub" ;;
    0.5.13* | 0.5.14*) echo "transformers==5.8.1 $hub" ;;
    0.5.15* | 0.5.1[6-9] | 0.5.2[01]) echo "transformers==5.12.1 $hub" ;;
    *) echo "transformers==5.19.0 tokenizers==0.23.3 huggingface_hub==2.4.0" ;;
  esac
}

# Shared by every release: what `import` of the engine's SGLang modules needs, pinned, --no-deps (their
# own dependency lists would pull the GPU serving stack back in). 0.5.16-0.5.20 import a few more than
# 0.5.23 (openai, xgrammar, einops, partial-json-parser, ...); they do no harm to the later releases.
SHARED_NO_DEPS=(
  "huggingface_hub==2.4.0" "httpx2==2.16.2" "httpcore2==2.16.2" "h11==0.16.0" "truststore==0.10.5"
  "safetensors==0.8.0" "sentencepiece==0.2.3"
  "psutil==7.2.2" "pybase64==1.5.1" "msgspec==0.22.0" "pyzmq==27.3.0" "tqdm==4.70.1" "dill==0.4.1"
  "starlette==1.10.0" "anyio==4.16.0" "typer==0.29.2"
  "aiohttp==3.14.5" "multidict==7.2.1" "yarl==1.25.1" "propcache==0.5.4" "frozenlist==1.8.0"
  "aiohappyeyeballs==2.7.1" "aiosignal==1.4.0"
  "apache-tvm-ffi==0.1.11" "compressed-tensors==0.20.1" "loguru==0.7.3" "gguf==0.19.0"
  "openai==2.6.1" "httpx==0.28.1" "httpcore==1.0.9" "jiter==0.11.1" "distro==1.9.0" "sniffio==1.3.1"
  "partial-json-parser==0.2.1.1.post6" "xgrammar==0.2.1" "einops==0.8.1" "shellingham==1.5.4"
  "annotated-doc==0.0.3"
)
# Common pure-Python (or ubiquitous) packages; skipped by pip when the system already has them.
SHARED_WITH_DEPS=(numpy orjson requests packaging pillow pyyaml regex filelock fsspec pydantic click jinja2
                  sympy pytest pytest-xdist hypothesis)

pip_q() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }

t0=$(date +%s)
mkdir -p "$HOME_DIR/releases"
stamp="$VENV/.shared-$(printf '%s\n' "${SHARED_NO_DEPS[@]}" "${SHARED_WITH_DEPS[@]}" | cksum | cut -d' ' -f1)"
if [[ ! -e "$stamp" ]]; then
  [[ -x "$VENV/bin/python" ]] || { echo "== creating $VENV"; "$PYTHON" -m venv --system-site-packages "$VENV"; }
  if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    # A pinned version: an unpinned torch pulls a multi-GB CUDA build from PyPI.
    echo "== no torch visible: installing torch ${TORCH_VERSION:-2.13.0}"
    pip_q "torch==${TORCH_VERSION:-2.13.0}"
  fi
  echo "== shared import-time packages"
  pip_q --no-deps "${SHARED_NO_DEPS[@]}"
  pip_q "${SHARED_WITH_DEPS[@]}"
  rm -f "$VENV"/.shared-*
  touch "$stamp"
fi
for v in "${RELEASES[@]}"; do
  dir="$HOME_DIR/releases/$v"
  [[ -e "$dir/.complete" ]] && continue
  echo "== sglang==$v --no-deps --target releases/$v (+ $(release_pins "$v"))"
  rm -rf "$dir.tmp"
  # shellcheck disable=SC2046  # the pins are words
  pip_q --no-deps --target "$dir.tmp" "sglang==$v" $(release_pins "$v")
  rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.complete"
done
t1=$(date +%s)
echo "== environments ready in $((t1 - t0)) s ($(du -sm "$HOME_DIR" | cut -f1) MB under $HOME_DIR)"

# The import path of a release: the stubs, then its folder; 0.5.10-0.5.12.post1 import sgl_kernel on the
# way to ModelRunner, so they also get its import-only stub (scripts/sglang_stubs/kernel).
release_path() {
  case "$1" in
    0.5.1[012] | 0.5.1[012].*) echo "$STUBS/kernel:$STUBS:$HOME_DIR/releases/$1" ;;
    *) echo "$STUBS:$HOME_DIR/releases/$1" ;;
  esac
}

status=0
for v in "${RELEASES[@]}"; do
  pp="$(release_path "$v")"
  if [[ -n "${SGLANG_ENV_ONLY:-}" ]]; then
    if PYTHONPATH="$pp" "$VENV/bin/python" - "$v" <<'EOF'
import sys, time
t = time.time()
from checker.engines.sglang import SglangEngine
e = SglangEngine()
assert e.version == sys.argv[1], (e.version, sys.argv[1])
print(f"== SGLang {e.version} imports for the checker in {time.time() - t:.1f} s")
EOF
    then
      echo "use it:  PYTHONPATH=$pp $VENV/bin/python -m checker derive --engine both ..."
    else
      echo "== SGLang $v does not import in its environment" >&2
      status=1
    fi
    continue
  fi
  # CHECKER_REQUIRE_SGLANG: the sglang tests fail (not skip) unless exactly this release imports.
  (cd "$REPO"
   # The newer-release tests (a release under a higher version number, derived by its own code) start
   # their own SGLang processes: run on the last release of the list only (the newest by default).
   newer="" what=""
   if [[ "$v" == "${RELEASES[${#RELEASES[@]}-1]}" ]]; then newer=tests/test_engine_newer.py what=", a newer release"; fi
   echo "== pytest -m sglang (engine comparison, the two 0.5.23 fixes, launch-command parser, the installed class under PP, its weights, the --engine examples$what)  (SGLang $v)"
   t2=$(date +%s)
   rc=0
   # shellcheck disable=SC2086  # $newer: no word or one
   CHECKER_REQUIRE_SGLANG="$v" PYTHONPATH="$pp" "$VENV/bin/python" -m pytest tests/test_engine_sglang.py \
     tests/test_engine_fixes.py tests/test_launch_command.py tests/test_pp_support.py tests/test_weights.py \
     tests/test_examples.py tests/test_replay.py $newer -m sglang \
     -p no:cacheprovider -n 0 "$@" || rc=$?
   echo "== SGLang $v tests: $(( $(date +%s) - t2 )) s"
   exit $rc) || status=1
done
echo "== total: $(( $(date +%s) - t0 )) s"
exit $status
