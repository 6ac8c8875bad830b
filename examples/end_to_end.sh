#!/usr/bin/env bash
# End to end, as a plugin author would: a fresh virtual environment, `pip install` of the example
# plugin, its pass in `ge passes`, a pipeline config that turns a built-in pass off and inserts the
# example pass after cse, compile with --dump-ir, run, draw. Nothing in this repository changes.
#
#   bash examples/end_to_end.sh [WORK_DIR]
#
# The fresh environment reuses this checkout's .venv through a .pth file, so nothing is downloaded.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
dev_py="$repo/.venv/bin/python"

echo "== fresh virtual environment in $work/venv"
"$dev_py" -m venv --without-pip "$work/venv"
py="$work/venv/bin/python"
site_new="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
site_dev="$("$dev_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$site_dev')" > "$site_new/_ge_dev_env.pth"
ge() { "$py" -m ge_core.cli "$@"; }

echo "== pip install the example plugin (its own distribution)"
rm -rf "$work/ge_example_plugin"
cp -r "$here/ge_example_plugin" "$work/ge_example_plugin"
"$py" -m pip install -q --no-deps --no-build-isolation --no-index --disable-pip-version-check "$work/ge_example_plugin"
ge plugins | grep -E "ge_example|name"

echo "== the resolved pipeline with examples/pipelines/example_after_cse.toml"
COLUMNS=160 ge passes --config "$here/pipelines/example_after_cse.toml"

echo "== a model with a duplicate Relu, a double negation and x*3+0.5"
"$py" - "$work/model.onnx" <<'PY'
import sys
import onnx
from onnx import TensorProto, helper
nodes = [helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Relu", ["x"], ["r2"]),
         helper.make_node("Add", ["r1", "r2"], ["s"]), helper.make_node("Neg", ["s"], ["n1"]),
         helper.make_node("Neg", ["n1"], ["n2"]), helper.make_node("Mul", ["n2", "three"], ["m"]),
         helper.make_node("Add", ["m", "half"], ["y"])]
inits = [helper.make_tensor("three", TensorProto.FLOAT, [], [3.0]), helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])]
g = helper.make_graph(nodes, "demo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], inits)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[1])
PY

echo "== compile with the config, dumping the IR after every pass that changed it"
rm -rf "$work/ir"
ge compile "$work/model.onnx" -o "$work/model.om" --config "$here/pipelines/example_after_cse.toml" \
   --dump-ir "$work/ir" --report "$work/report.json" -q
ls "$work/ir"
last="$(ls "$work/ir" | tail -1)"
echo "-- $last"; cat "$work/ir/$last"

echo "== run it and draw it"
ge run "$work/model.om"
ge viz "$work/model.onnx" -o "$work/before.svg"
ge viz "$work/model.om" -o "$work/after.html"
echo "done: $work"
