#!/usr/bin/env bash
# Build CPU-only environments in which the installed-SGLang engine (--engine sglang|both) runs the code of
# several SGLang releases, then run the engine comparison tests (pytest -m sglang) against each release.
#
#   scripts/sglang_cpu_env.sh                          # one release per engine code group (CI); test each
#   SGLANG_RELEASES=all scripts/sglang_cpu_env.sh       # every release the engine runs (0.5.10 on)
#   SGLANG_RELEASES="0.5.18" scripts/sglang_cpu_env.sh -x -q   # extra args go to pytest
#   SGLANG_ENV_ONLY=1 scripts/sglang_cpu_env.sh         # build only; prints how to use each release
#   SGLANG_JOBS=1 scripts/sglang_cpu_env.sh             # releases tested at once (default: the CPU count, at most 2)
#
# Exit codes: 0 every release's tests passed (or, with SGLANG_ENV_ONLY, imported); 1 a release failed;
# 2 bad usage; 3 an environment could not be built (pip failed; nothing was tested).
#
# The releases, their pins and their import paths come from scripts/sglang_envs.py, which derives them
# from the one release table (checker/core/releases/releases.py MODELLED_RELEASES).
#
# Layout (under SGLANG_CPU_HOME, default ~/.cache/pp-checker/sglang-cpu, kept between runs):
#   venv/            ONE venv (system site-packages visible, for torch) with the import-time packages every
#                    release shares, installed --no-deps and pinned;
#   releases/X/      `pip install --no-deps --target` of sglang==X plus the transformers/tokenizers that
#                    release pins (scripts/sglang_envs.py TRANSFORMERS, from each wheel's Requires-Dist; a
#                    later transformers clashes with their config registry: "'qwen3_asr' is already used
#                    by a Transformers config").
# A release is used by putting its folder (after the stubs) first on PYTHONPATH (releases before 0.5.13
# also scripts/sglang_stubs/kernel first; SGLANG_ENV_ONLY=1 prints each release's line):
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
envs() { "$PYTHON" "$REPO/scripts/sglang_envs.py" "$@"; }
# Every release the engine runs (checker/engines/sglang.py SUPPORTED_VERSIONS; 0.5.9 and older compute
# the slots per request and the request cap inline in init_memory_pool, which the engine cannot call);
# CI: one release of each engine code group (scripts/sglang_envs.py ENGINE_GROUPS, the groups whose code
# the engine drives differently). docs/engine.md gives the cold and warm cost.
case "${SGLANG_RELEASES:-}" in
  "") read -r -a RELEASES <<<"$(envs releases ci)" ;;
  all) read -r -a RELEASES <<<"$(envs releases all)" ;;
  *) read -r -a RELEASES <<<"$SGLANG_RELEASES" ;;
esac
[[ ${#RELEASES[@]} -gt 0 ]] || { echo "sglang_cpu_env.sh: no release to build (SGLANG_RELEASES)" >&2; exit 2; }

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

# Exit 3 when an environment cannot be built (pip failed: the index unreachable, a release not
# published), so CI can tell that from a test that failed (exit 1).
cannot_build() { echo "sglang_cpu_env.sh: could not build the environments: $*" >&2; exit 3; }
pip_q() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@" || cannot_build "pip install ${*: -1} failed"
}

t0=$(date +%s)
mkdir -p "$HOME_DIR/releases"
stamp="$VENV/.shared-$(printf '%s\n' "${SHARED_NO_DEPS[@]}" "${SHARED_WITH_DEPS[@]}" | cksum | cut -d' ' -f1)"
if [[ ! -e "$stamp" ]]; then
  [[ -x "$VENV/bin/python" ]] || { echo "== creating $VENV"; "$PYTHON" -m venv --system-site-packages "$VENV" || cannot_build "venv"; }
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
  pins="$(envs pins "$v")"
  echo "== sglang==$v --no-deps --target releases/$v (+ $pins)"
  rm -rf "$dir.tmp"
  # shellcheck disable=SC2086  # the pins are words
  pip_q --no-deps --target "$dir.tmp" "sglang==$v" $pins
  rm -rf "$dir" && mv "$dir.tmp" "$dir" && touch "$dir/.complete"
done
t1=$(date +%s)
echo "== environments ready in $((t1 - t0)) s ($(du -sm "$HOME_DIR" | cut -f1) MB under $HOME_DIR)"

status=0
if [[ -n "${SGLANG_ENV_ONLY:-}" ]]; then
  for v in "${RELEASES[@]}"; do
    pp="$(envs path "$v" "$HOME_DIR")"
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
  done
  exit $status
fi

# The group: every test file with a test marked sglang (a new file joins by its marker). The newer-release
# tests (a release under a higher version number, derived by its own code) start their own SGLang
# processes: they run on the last release of the list only (the newest by default).
mapfile -t FILES < <(cd "$REPO" && grep -l "pytest.mark.sglang" tests/test_*.py | grep -vx "tests/test_engine_newer.py")
NEWEST="${RELEASES[${#RELEASES[@]}-1]}"

# One pytest per release, SGLANG_JOBS at a time (each is one process, mostly on one core; default: the
# CPU count, at most 2). Each writes its own log, printed whole when all have ended, and has its own
# --basetemp. The newest starts first: it also runs the newer-release tests, the longest of the runs.
JOBS="${SGLANG_JOBS:-$(nproc 2>/dev/null || echo 1)}"
(( JOBS >= 1 )) || JOBS=1
(( JOBS <= 2 )) || JOBS=2
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/sglang-engine-group.XXXXXX")"
trap 'rm -rf "$LOGS"' EXIT

run_release() {  # $1: the release; the rest: pytest's. Writes $LOGS/$1.log and $LOGS/$1.rc.
  local v="$1" pp t2 rc=0
  local files=("${FILES[@]}")
  shift
  pp="$(envs path "$v" "$HOME_DIR")"
  [[ "$v" == "$NEWEST" ]] && files+=(tests/test_engine_newer.py)
  t2=$(date +%s)
  {
    echo "== pytest -m sglang ${files[*]#tests/}  (SGLang $v)"
    # CHECKER_REQUIRE_SGLANG: the sglang tests fail (not skip) unless exactly this release imports.
    (cd "$REPO" && CHECKER_REQUIRE_SGLANG="$v" PYTHONPATH="$pp" timeout "${SGLANG_RELEASE_TIMEOUT_S:-1800}" \
      "$VENV/bin/python" -m pytest "${files[@]}" -m sglang -p no:cacheprovider -n 0 \
      --basetemp "$LOGS/$v.tmp" "$@") || rc=$?
    echo "== SGLang $v tests: $(( $(date +%s) - t2 )) s (exit $rc)"
  } >"$LOGS/$v.log" 2>&1
  echo "$rc" >"$LOGS/$v.rc.tmp" && mv "$LOGS/$v.rc.tmp" "$LOGS/$v.rc"
}

declare -A shown=()
show_finished() {  # print the log of each release that has ended, once, as it ends
  local v
  for v in "${RELEASES[@]}"; do
    [[ -e "$LOGS/$v.rc" && -z "${shown[$v]:-}" ]] || continue
    shown[$v]=1
    cat "$LOGS/$v.log"
    [[ "$(cat "$LOGS/$v.rc")" == 0 ]] || { status=1; echo "== SGLang $v: FAILED" >&2; }
  done
}

order=("$NEWEST")
for v in "${RELEASES[@]}"; do [[ "$v" == "$NEWEST" ]] || order+=("$v"); done
running=0
for v in "${order[@]}"; do
  if (( running >= JOBS )); then
    wait -n || true
    running=$((running - 1))
    show_finished
  fi
  run_release "$v" "$@" &
  running=$((running + 1))
done
wait || true
show_finished
for v in "${RELEASES[@]}"; do
  [[ -n "${shown[$v]:-}" ]] || { status=1; echo "== SGLang $v: ended without an exit code" >&2; }
done
echo "== total: $(( $(date +%s) - t0 )) s ($JOBS at a time)"
exit $status
