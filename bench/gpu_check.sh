#!/usr/bin/env bash
# The GPU check of verifierd's meter and the VCA, as one command for a GPU host (under 5 minutes
# on an H200; no network needed there):
#
#   bash bench/gpu_check.sh            preflight, bench/gpu_check.py (VCA of a decode-heavy
#                                      generation vs its verification prefill, metered with NVML
#                                      GPM), then the GPU tests (tests/gpu/ and the real-NVML meter
#                                      test). Files go to $OUT (default /tmp/gpu_check_out).
#
#   bash bench/gpu_check.sh --fetch-wheels NAME==VERSION ...
#                                      here, with network: download manylinux wheels for Python
#                                      3.12 into .whl/ (ignored by git); the device machine then
#                                      installs everything in .whl/ before running (carry .whl).
#
# PYTHON picks the interpreter (default python3). Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu_check_out}
export OUT
mkdir -p "$OUT"
say() { echo "gpu_check.sh: $*"; }

if [ "${1:-}" = "--fetch-wheels" ]; then
  shift
  [ $# -gt 0 ] || { say "--fetch-wheels needs NAME==VERSION arguments"; exit 2; }
  grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
  plats=()
  for n in 28 27 17; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
  exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plats[@]}" --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 --platform any -d .whl "$@"
fi

started=$SECONDS
if compgen -G ".whl/*.whl" > /dev/null; then
  say "installing carried wheels: $(ls .whl | tr '\n' ' ')"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gpu_check_site .whl/*.whl || { say "wheel install failed"; exit 2; }
  export PYTHONPATH=/tmp/gpu_check_site${PYTHONPATH:+:$PYTHONPATH}
fi
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # CUDA and NVML number the GPUs alike
export PYTHONUNBUFFERED=1

# Preflight: what is there, and stop early when something required is not.
"$PY" - <<'PYEOF' || exit 2
import importlib, sys
print(f"gpu_check.sh: python {sys.version.split()[0]} at {sys.executable}")
required = ("torch", "transformers", "pynvml", "psutil", "numpy")
optional = ("vllm", "pytest", "aiohttp", "prometheus_client", "lmdb")
missing = []
for name in required + optional:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # an import can fail in many ways on a foreign image
        print(f"  {name:<18} absent ({type(exc).__name__}: {exc})")
        if name in required:
            missing.append(name)
        continue
    print(f"  {name:<18} {getattr(module, '__version__', 'present')}")
if missing:
    sys.exit(f"gpu_check.sh: missing {', '.join(missing)}: carry wheels in .whl/ (see --fetch-wheels)")
import torch, pynvml
print(f"  cuda               {torch.cuda.is_available()} {torch.version.cuda or ''}"
      f" {torch.cuda.get_device_name() if torch.cuda.is_available() else '(CPU dry run)'}")
try:
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        gpm = bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except pynvml.NVMLError as exc:
        gpm = f"no ({exc})"
    print(f"  nvml               driver {pynvml.nvmlSystemGetDriverVersion()}, GPM supported: {gpm}")
    pynvml.nvmlShutdown()
except pynvml.NVMLError as exc:
    print(f"  nvml               unavailable: {exc}")
PYEOF

status=0
say "step 1/2: bench/gpu_check.py (VCA, metered)"
timeout 170 "$PY" bench/gpu_check.py --out "$OUT" 2>&1 | tee "$OUT/gpu_check.log"
vca_rc=${PIPESTATUS[0]}
[ "$vca_rc" = 0 ] || { say "gpu_check.py failed (exit $vca_rc; 124 = timed out)"; status=1; }

say "step 2/2: GPU tests"
tests=(tests/verifierd/test_meter_nvml.py)
[ -d tests/gpu ] && tests=(tests/gpu "${tests[@]}")
if "$PY" -c "import pytest" 2>/dev/null; then
  timeout 120 "$PY" -m pytest -q -rs -p no:cacheprovider -o addopts= -m gpu "${tests[@]}" \
    2>&1 | tee "$OUT/gpu_tests.log"
  test_rc=${PIPESTATUS[0]}
  [ "$test_rc" = 0 ] || { say "GPU tests failed (exit $test_rc; 124 = timed out)"; status=1; }
else
  say "pytest absent: GPU tests not run"
  status=1
fi

say "done in $((SECONDS - started)) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
[ "$status" = 0 ] && say "all steps passed" || say "SOME STEPS FAILED"
exit $status
