#!/usr/bin/env bash
# Build the ge-python wheel from this checkout: bash scripts/build_wheel.sh [OUT_DIR] (default dist/).
#
# The package is not on a registry; install the wheel with
#   pip install dist/ge_python-*.whl              (or with extras: 'dist/ge_python-...whl[torch]')
# It holds ge_core, every built-in plugin (ge_opset, ge_onnx, ge_cpu, ...), ge_sdk and the entry
# points (console scripts ge and atc, group ge.plugins, pytest11, torch_dynamo_backends).
#
# The checkout's files (tracked, plus untracked ones git does not ignore) are copied to a
# temporary folder and built there, so no build/ or *.egg-info is left in the tree and no stale
# file of an earlier build gets into the wheel. `python -m build` is used when the Python has it,
# else `pip wheel --no-deps`; when that Python already has setuptools>=77 and wheel, the build
# runs without an isolated environment (nothing is downloaded). PYTHON picks the interpreter
# (default: .venv/bin/python when it exists, else python3).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/dist}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
if [ -n "${PYTHON:-}" ]; then py="$PYTHON"
elif [ -x "$root/.venv/bin/python" ]; then py="$root/.venv/bin/python"
else py=python3
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard \
     | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
     | tar --null -T - -cf -) | tar -xf - -C "$work"
else
  tar -C "$root" --exclude=./.venv --exclude=./build --exclude=./dist --exclude='*.egg-info' \
      --exclude=__pycache__ -cf - . | tar -xf - -C "$work"
fi

# run the build tools from the copy: in the checkout, a build/ folder (scripts/main.sh writes one)
# would shadow the `build` package
cd "$work"
isolation=()
if "$py" - <<'EOF' 2>/dev/null
import sys
import setuptools, wheel  # noqa: F401
major = int(setuptools.__version__.split(".")[0])
sys.exit(0 if major >= 77 else 1)
EOF
then
  isolation=(--no-isolation)
fi

if "$py" -c "import build" 2>/dev/null; then
  "$py" -m build --wheel --outdir "$out" "${isolation[@]}" "$work" >&2
else
  pipflags=()
  [ ${#isolation[@]} -gt 0 ] && pipflags=(--no-build-isolation)
  "$py" -m pip wheel --no-deps -q "${pipflags[@]}" -w "$out" "$work" >&2
fi
wheel="$(ls -t "$out"/ge_python-*.whl 2>/dev/null | head -n 1 || true)"
[ -n "$wheel" ] || { echo "error: no ge_python wheel was written to $out" >&2; exit 1; }
echo "$wheel"
