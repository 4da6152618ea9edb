#!/usr/bin/env bash
# The device check of issue 36, one command: bash bench/device_check.sh [device_check.py args]
# Needs, installed already (it installs nothing: the device machine has no network): python3
# with torch (CUDA), torchvision, pillow, numpy, xxhash, fsspec; one GPU, ~16 cores, ~10 GB of
# local disk for ~20,000 JPEGs, their packed store and its cache. Run from the repository root.
# Order: the GPU tests of tests/torch (when pytest is there), then bench/device_check.py,
# bounded by its own budget (--budget-s, 420 s) and by `timeout` here; its table is printed and
# its JSON (device_check.json) written even when the bound stops it.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
"$PY" - <<'PYEOF' || exit 2
import importlib.util
import sys
missing = [m for m in ("torch", "torchvision", "PIL", "numpy", "xxhash", "fsspec")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"device_check: error: not installed: {', '.join(missing)} (nothing is installed here)")
import torch
print(f"torch {torch.__version__}, CUDA {torch.cuda.is_available()}, "
      f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
PYEOF
if "$PY" -c "import pytest" 2>/dev/null; then
    timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/torch/test_prefetch.py \
        tests/torch/test_decoders.py -k "gpu or torchvision" 2>&1 | tail -5
fi
DATA="${TF_CHECK_DIR:-$(mktemp -d /tmp/tf-device-check.XXXXXX)}"
timeout -s TERM 450 "$PY" bench/device_check.py --data "$DATA" --out device_check.json "$@"
rc=$?
echo "device_check: exit $rc; data in $DATA (rm -rf it when done)"
exit $rc
