"""No reader in the product deserializes with pickle or marshal, or loads code (issue 15, audit).

An AST scan of ``ge_core``, ``plugins`` and ``sdk/ge_sdk`` (not the tests): every call of a
loader that can unpickle or run code must be absent, or carry the keyword that makes it safe.
The readers that do exist are covered by their own tests (``tests/torch/test_trust_pt2.py``,
``tests/tensorflow/test_trust_tf_files.py``, ``tests/reliability/test_trust_feed_files.py``).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "ge_core", ROOT / "plugins", ROOT / "sdk" / "ge_sdk"]

#: dotted call -> None (never allowed) or (keyword, required value)
RULES: dict[str, tuple[str, object] | None] = {
    "pickle.load": None, "pickle.loads": None, "pickle.Unpickler": None, "marshal.load": None,
    "marshal.loads": None, "dill.load": None, "dill.loads": None, "joblib.load": None, "shelve.open": None,
    "torch.load": None, "torch.export.load": None, "torch.jit.load": None, "torch.package.PackageImporter": None,
    "load_pt2": None, "yaml.load": None, "yaml.unsafe_load": None,
    "np.load": ("allow_pickle", False), "numpy.load": ("allow_pickle", False),
    "keras.models.load_model": ("safe_mode", True), "keras.saving.load_model": ("safe_mode", True),
    "tf.keras.models.load_model": ("safe_mode", True),
}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _violations(tree: ast.AST, rel: str) -> list[str]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in RULES:
                rule = RULES[name]
                kw = {k.arg: k.value for k in node.keywords}
                ok = rule is not None and isinstance(kw.get(rule[0]), ast.Constant) and kw[rule[0]].value is rule[1]
                if not ok:
                    need = "never" if rule is None else f"only with {rule[0]}={rule[1]}"
                    out.append(f"{rel}:{node.lineno}: {name}(...) ({need})")
            # numba's on-disk cache is a pickle: @numba.njit(cache=True) / jit(cache=True)
            if name and name.split(".")[-1] in ("jit", "njit", "vectorize", "guvectorize", "cfunc"):
                for k in node.keywords:
                    if k.arg == "cache" and not (isinstance(k.value, ast.Constant) and k.value.value is False):
                        out.append(f"{rel}:{node.lineno}: {name}(cache=...) (numba caches are pickles)")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for m in mods:
                if m.split(".")[0] in ("pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle"):
                    out.append(f"{rel}:{node.lineno}: imports {m}")
    return out


def _files():
    for base in SOURCES:
        yield from sorted(base.rglob("*.py"))


#: the one reader of marshal: code objects ge compiled itself from checked source, read back only
#: from the user's own cache folder after its owner, permission and SHA-256 checks and found only
#: by the hash of that source (docs/security.md, "The user's cache folder"; Python's own
#: ``__pycache__`` is the same trust). No file from outside reaches it.
ALLOWED = {"sdk/ge_native/gensrc.py": {"imports marshal", "marshal.loads(...) (never)"}}


def test_no_reader_unpickles_or_unmarshals():
    found = []
    for path in _files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = str(path.relative_to(ROOT))
        allowed = ALLOWED.get(rel, set())
        found += [v for v in _violations(tree, rel) if v.split(": ", 1)[1] not in allowed]
    assert not found, "unsafe loaders in the product:\n" + "\n".join(found)


def test_the_marshal_reader_reads_only_the_checked_cache():
    src = (ROOT / "sdk" / "ge_native" / "gensrc.py").read_text(encoding="utf-8")
    assert src.count("marshal.loads(") == 1
    body = src[src.index("def compile_checked"):]
    # the bytes come from the cache's checked reader, and nothing else is unmarshalled
    assert body.index("native.read_data(key)") < body.index("marshal.loads(data)")


@pytest.mark.parametrize("src,bad", [
    ("import numpy as np\nnp.load(p)\n", True),
    ("import numpy as np\nnp.load(p, allow_pickle=True)\n", True),
    ("import numpy as np\nnp.load(p, allow_pickle=False)\n", False),
    ("import torch\ntorch.export.load(p)\n", True),
    ("import keras\nkeras.models.load_model(p, compile=False)\n", True),
    ("import keras\nkeras.models.load_model(p, safe_mode=True)\n", False),
    ("import numba\n@numba.njit(cache=True)\ndef f(x):\n    return x\n", True),
    ("import pickle\n", True),
])
def test_the_scan_sees_what_it_should(src, bad):
    assert bool(_violations(ast.parse(src), "x.py")) is bad
