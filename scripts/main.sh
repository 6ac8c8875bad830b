#!/usr/bin/env bash
# The main job on a fresh machine: set up, compile a model that the onnx package ships
# (ResNet-50 from onnx/backend/test/data/light) to an .om, run it, and print the report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
model="$(.venv/bin/python -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_resnet50.onnx"))')"
mkdir -p build
.venv/bin/ge compile "$model" -o build/resnet50.om --report build/resnet50.report.json -q
.venv/bin/ge run build/resnet50.om --random --repeat 3
.venv/bin/ge inspect build/resnet50.om
