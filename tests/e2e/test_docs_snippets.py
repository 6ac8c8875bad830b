"""The Python snippets of README.md, docs/plugin-guide.md and docs/hooks.md run as written (each in
a fresh process; README's API snippets with the model file and arrays they name prepared first,
docs/hooks.md's hook signatures with ``hookimpl`` imported). docs/tools.md has its own test."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

MODEL = """
import numpy as np, onnx
from onnx import helper, TensorProto
g = helper.make_graph([helper.make_node("Relu", ["data"], ["r"]), helper.make_node("Softmax", ["r"], ["prob"])], "m",
                      [helper.make_tensor_value_info("data", TensorProto.FLOAT, (1, 10))],
                      [helper.make_tensor_value_info("prob", TensorProto.FLOAT, (1, 10))])
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "model.onnx")
x, x1, x2, x3 = (np.random.default_rng(i).standard_normal((1, 10)).astype(np.float32) for i in range(4))
"""

#: what README's snippets take as given, by a word each snippet contains
README_GIVEN = {
    'ge.load("model.onnx")': MODEL,
    "rewrite(graph,": MODEL + "import ge_core as ge\ngraph = ge.load('model.onnx')\n",
    "torch.compile": "import torch\nmodel = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())\n"
                     "x = torch.randn(2, 3, 224, 224)\n",
}


def python_blocks(page: pathlib.Path) -> list[str]:
    blocks, current, lang = [], None, None
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            if current is None:
                current, lang = [], line.strip()[3:]
            else:
                if lang == "python":
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def run(code: str, cwd: pathlib.Path) -> None:
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, code[-1500:] + "\n---\n" + r.stderr[-2000:]


CASES = ([("README.md", i) for i in range(len(python_blocks(ROOT / "README.md")))]
         + [("docs/plugin-guide.md", i) for i in range(len(python_blocks(ROOT / "docs" / "plugin-guide.md")))]
         + [("docs/hooks.md", i) for i in range(len(python_blocks(ROOT / "docs" / "hooks.md")))])


@pytest.mark.parametrize("page,index", CASES, ids=[f"{p}#{i}" for p, i in CASES])
def test_snippet_runs_as_written(page, index, tmp_path):
    block = python_blocks(ROOT / page)[index]
    given = ""
    if page == "README.md":
        given = next((v for k, v in README_GIVEN.items() if k in block), "")
    elif page == "docs/hooks.md":
        given = "from ge_core import hookimpl\n"
    run(given + block, tmp_path)


def test_the_pages_have_snippets():
    assert len(CASES) >= 20
