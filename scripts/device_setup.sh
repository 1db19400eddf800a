# Sourced by the scripts/gpu_*.sh device calls: install this checkout (no network there) and, when
# the call carried `.whl` (Liger-Kernel, Cut Cross-Entropy), the competitor wheels on PYTHONPATH.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
