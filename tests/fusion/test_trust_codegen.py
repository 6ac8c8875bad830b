"""Trust boundary of generated source (issue 15): nothing a model holds runs as code.

A fused program (``program`` / ``epilogue`` of ``ge.fused::*`` nodes) is validated against each
op's attribute schema before any code is generated (``codegen.loads``, and ``load_om`` through
``OpDef.check``); generators bind attributes and model names as objects and build source from
generator-made tokens only, checked by ``ge_native.gensrc`` before it is compiled; a source model
carrying a compiler-internal op is refused at load. Every hostile case below would run its
payload without those checks (the key injection did, before them: it created the canary).
"""

import contextlib
import copy
import io
import json
import math
import os
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import ge_core as ge
from ge_core.cli import main as ge_main
from ge_cpu.fused import codegen
from ge_native import gensrc
from ge_sdk.testing import GraphBuilder, run_onnxruntime

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz"))
from fuzz_targets import Canary, codegen_seed_models, internal_nodes, read_om, with_node, write_om  # noqa: E402

from ge_core.kernel import caps

SEEDS = codegen_seed_models()


@pytest.fixture
def canary(tmp_path):
    c = Canary(str(tmp_path))
    yield c
    os.environ.pop(c.env, None)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """Each seed compiled and saved: (.om path, model definition, weights blob)."""
    d = tmp_path_factory.mktemp("seeds")
    out = {}
    for name, m in SEEDS.items():
        p = str(d / f"{name}.om")
        ge.compile(m.SerializeToString()).save(p)
        out[name] = (p, *read_om(p))
    return out


def _feeds(name):
    rng = np.random.default_rng(1)
    if name == "conv":
        return {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32),
                "q": rng.standard_normal((2, 8)).astype(np.float32)}
    return {"u": rng.standard_normal((3, 5)).astype(np.float32)}


def _payload(c: Canary, kind: int = 0) -> str:
    return [f"__import__('pathlib').Path({c.path!r}).touch()",
            f"__import__('os').environ.__setitem__({c.env!r},'1')"][kind]


# ------------------------------------------------------------------------------------------------
def test_canary_detects_a_payload_that_runs(canary):
    """The oracle of these tests and of the fuzz target can fail: each payload kind trips it."""
    assert canary.triggered() is None
    for kind in (0, 1):
        exec(_payload(canary, kind))  # noqa: S102 - the point: a payload that runs is seen
        assert canary.triggered()
        if os.path.exists(canary.path):
            os.remove(canary.path)
        os.environ.pop(canary.env, None)
    assert canary.triggered() is None


def test_seed_models_compile_to_every_internal_node_and_match_onnxruntime(compiled):
    ops = set()
    for name, (path, d, _) in compiled.items():
        ops |= {n["op"] for n in internal_nodes(d)}
        model = ge.load_om(path)
        got = model.run(_feeds(name))
        sess = ort.InferenceSession(SEEDS[name].SerializeToString(), providers=["CPUExecutionProvider"])
        for (k, g), w in zip(got.items(), sess.run(None, _feeds(name))):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=f"{name}:{k}")
    assert {"FusedConv", "FusedElemwise", "FusedMatMul", "Softmax", "LayerNorm"} <= ops


# ------------------------------------------------------------------------------------------------
# crafted .om files: refused at load, payload never runs
# ------------------------------------------------------------------------------------------------
def _program_node(d, op):
    return next(n for n in internal_nodes(d) if n["op"] == op)


VECTORS = {
    # the key pasted into generated NumPy code before: this one created the canary
    "attr-key": lambda p: ("attrs", "FusedElemwise", [["LeakyRelu", ["a0"], {f"alpha={p} or 0.3, beta": 1}]]),
    "attr-dunder-key": lambda p: ("attrs", "FusedElemwise", [["Relu", ["a0"], {"__class__": 1}]]),
    "attr-value": lambda p: ("attrs", "FusedElemwise", [["LeakyRelu", ["a0"], {"alpha": p}]]),
    "attr-choice": lambda p: ("attrs", "FusedElemwise", [["Gelu", ["a0"], {"approximate": f"tanh' or {p} or '"}]]),
    "attr-huge-int": lambda p: ("attrs", "FusedElemwise", [["Elu", ["a0"], {"alpha": 10**400}]]),
    "attr-nested-list": lambda p: ("attrs", "FusedElemwise", [["Clip", ["a0"], {"min": [[p]]}]]),
    "ref": lambda p: ("attrs", "FusedElemwise", [["Relu", [f"a0) or {p} or (a0"], {}]]),
    "ref-out-of-range": lambda p: ("attrs", "FusedElemwise", [["Add", ["a0", "a5"], {}]]),
    "ref-unicode-digit": lambda p: ("attrs", "FusedElemwise", [["Relu", ["a\u0661"], {}]]),
    "ref-y-without-anchor": lambda p: ("attrs", "FusedElemwise", [["Relu", ["y"], {}]]),
    "op-name": lambda p: ("attrs", "FusedElemwise", [[p, ["a0"], {}]]),
    "arity": lambda p: ("attrs", "FusedElemwise", [["Add", ["a0"], {}]]),
    "epilogue-key": lambda p: ("conv", "FusedConv", [["Relu", ["y"], {f"x={p}": 1}]]),
    "epilogue-ref": lambda p: ("conv", "FusedConv", [["Add", ["y", "a3"], {}]]),
    "not-a-program": lambda p: ("attrs", "FusedElemwise", p),
}


@pytest.mark.parametrize("vector", sorted(VECTORS))
def test_crafted_om_program_is_refused_at_load_and_never_runs(vector, compiled, canary, tmp_path, monkeypatch):
    monkeypatch.setenv("GE_FUSION_JIT", "0")  # the generated NumPy code, where the key was pasted
    seed, op, prog = VECTORS[vector](_payload(canary))
    _, d, blob = compiled[seed]
    d = json.loads(json.dumps(d))
    node = _program_node(d, op)
    attr = "program" if op == "FusedElemwise" else "epilogue"
    node["attrs"][attr] = {"s": prog if isinstance(prog, str) else json.dumps(prog)}
    path = str(tmp_path / "crafted.om")
    write_om(path, d, blob)
    with pytest.raises(ge.OmFormatError, match=f"{node['name']}.*{attr}"):
        ge.load_om(path)
    for cmd in (["run", path], ["inspect", path, "--source"]):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            assert ge_main(cmd) == ge.OmFormatError.exit_code
        assert "the stored graph is invalid" in err.getvalue()
    assert canary.triggered() is None


@pytest.mark.parametrize("attr,value", [("approximate", "tanh'); import os; ('"), ("axis", "0"), ("axis", 256),
                                        ("scale", [1]), ("transA", 7), ("epsilon", "1e-5")])
def test_crafted_om_node_attribute_is_refused_at_load(attr, value, compiled, tmp_path):
    _, d, blob = compiled["conv"]
    d = json.loads(json.dumps(d))
    op = {"approximate": "FusedElemwise", "axis": "Softmax", "scale": "FusedMatMul", "transA": "FusedMatMul",
          "epsilon": "LayerNorm"}[attr]
    node = next(n for n in internal_nodes(d) if n["op"] == op)
    if attr == "approximate":  # a Gelu node: one input, like the FusedElemwise it replaces
        node["op"] = "Gelu"
        node["inputs"] = node["inputs"][:1]
    if attr == "scale":
        node["op"], attr = "FusedMatMul", "alpha"
    node["attrs"][attr] = {"s": value} if isinstance(value, str) else {"i": value} if type(value) is int \
        else {"list": [{"i": v} for v in value]}
    path = str(tmp_path / "crafted.om")
    write_om(path, d, blob)
    with pytest.raises(ge.OmFormatError, match=f"attribute {attr} must be|axis 256 is out of range"):
        ge.load_om(path)


def test_hostile_names_in_an_om_never_reach_generated_source(compiled, tmp_path, canary):
    """Value, node and graph names of a loaded .om (quotes, newlines, payloads) stay data: the sink
    executor's source is made of slot numbers only, and the model still runs right."""
    path0, d, blob = compiled["attrs"]
    d = json.loads(json.dumps(d))
    evil = f"u'] or {_payload(canary)} or feeds['\n#"
    text = json.dumps(d).replace('"u"', json.dumps(evil))
    d = json.loads(text)
    d["graph"]["name"] = f"g\n{_payload(canary, 1)}"
    for n in d["graph"]["nodes"]:
        n["name"] = f"n\n{_payload(canary)}\n#{n['name']}"
    path = str(tmp_path / "names.om")
    write_om(path, d, blob)
    model = ge.load_om(path)
    assert model.input_names == [evil]
    src = model.executable.source
    for bad in ("'", '"', "__", "import", "#", "\\"):
        assert bad not in src
    gensrc.check_source(src, gensrc.Vocabulary(names=frozenset(), patterns=(r"[A-Za-z_][A-Za-z0-9_]*",),
                                               attributes=frozenset({"dtype", "shape", "copy", "ndarray", "add",
                                                                     "subtract", "multiply", "divide", "maximum",
                                                                     "minimum", "negative", "absolute", "exp", "log",
                                                                     "sqrt", "tanh", "sin", "cos", "reciprocal",
                                                                     "floor", "ceil"}),
                                               keywords=frozenset({"out"})))
    want = ge.load_om(path0).run(_feeds("attrs"))
    got = model.run({evil: _feeds("attrs")["u"]})
    np.testing.assert_array_equal(list(got.values())[0], list(want.values())[0])
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert ge_main(["inspect", path, "--source"]) == 0
    assert "import" not in out.getvalue() and "def run0(feeds):" in out.getvalue()
    assert canary.triggered() is None


# ------------------------------------------------------------------------------------------------
# source models: internal domains refused
# ------------------------------------------------------------------------------------------------
def _onnx_with_fused_node(canary, nested: bool):
    m = copy.deepcopy(SEEDS["attrs"])
    prog = json.dumps([["LeakyRelu", ["a0"], {f"alpha={_payload(canary)} or 0.3, beta": 1}]])
    node = helper.make_node("FusedElemwise", ["u"], ["fz"], domain="ge.fused", name="sneaky", program=prog)
    return with_node(m, node, nested)


@pytest.mark.parametrize("nested", [False, True], ids=["top", "in-if-branch"])
def test_source_onnx_with_an_internal_node_is_refused_at_load(nested, canary, tmp_path, monkeypatch):
    monkeypatch.setenv("GE_FUSION_JIT", "0")
    data = _onnx_with_fused_node(canary, nested)
    with pytest.raises(ge.ModelFileError, match=r"node 'sneaky' \(ge.fused::FusedElemwise\).*domain 'ge.fused'"):
        ge.load(data)
    with pytest.raises(ge.ModelFileError, match="internal to the compiler"):
        ge.compile(data)
    p = tmp_path / "m.onnx"
    p.write_bytes(data)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert ge_main(["compile", str(p), "-o", str(tmp_path / "m.om")]) == ge.ModelFileError.exit_code
    assert not (tmp_path / "m.om").exists()
    assert canary.triggered() is None


def test_internal_domains_are_the_compilers():
    from ge_core.plugins import registries

    ops = registries().ops
    # the fused ops, the cpu backend's blocked-layout ops (its nchwc_layout pass makes them) and
    # ge_quant's fake-quant (its qdq_regions pass makes it)
    assert ops.internal_domains() == {"ge.fused", "ge.cpu", "ge.quant"}
    assert all(d.internal and d.check is not None for d in ops.values() if d.domain in ("ge.fused", "ge.cpu", "ge.quant"))


# ------------------------------------------------------------------------------------------------
# the program schema (codegen.loads)
# ------------------------------------------------------------------------------------------------
BAD_PROGRAMS = {
    "unknown key": [["LeakyRelu", ["a0"], {"alpha": 0.1, "beta": 1}]],
    "key on an op without attrs": [["Relu", ["a0"], {"out": 1}]],
    "string for a float": [["Elu", ["a0"], {"alpha": "0.5"}]],
    "bool for a float": [["Elu", ["a0"], {"alpha": True}]],
    "choice": [["Gelu", ["a0"], {"approximate": "exact"}]],
    "overflow": [["Elu", ["a0"], {"alpha": 10**400}]],
    "ref beyond inputs": [["Add", ["a0", "a2"], {}]],
    "leading zero": [["Relu", ["a01"], {}]],
    "forward ref": [["Relu", ["t0"], {}]],
    "y without anchor": [["Relu", ["y"], {}]],
    "arity": [["Add", ["a0", "a1", "a0"], {}]],
    "no operands": [["Sum", [], {}]],
    "unknown op": [["System", ["a0"], {}]],
    "empty": [],
    "too long": [["Relu", ["a0"], {}]] * (codegen.MAX_STEPS + 1),
    "not a list": {"a": 1},
}


@pytest.mark.parametrize("case", sorted(BAD_PROGRAMS))
def test_loads_refuses_programs_outside_the_schema(case):
    with pytest.raises(ValueError):
        codegen.loads(json.dumps(BAD_PROGRAMS[case]), n_inputs=2)


def test_loads_accepts_and_normalises_what_the_compiler_writes():
    steps = codegen.loads(json.dumps([["Add", ["y", "a0"], {}], ["Clip", ["t0"], {"min": 0, "max": None}],
                                      ["Gelu", ["t1"], {"approximate": "tanh"}], ["Sum", ["t2"], {}]]),
                          n_inputs=1, anchor=True)
    assert steps[1][2] == {"min": 0.0, "max": None} and type(steps[1][2]["min"]) is float
    for op, form in codegen.OPS.items():
        assert isinstance(form.attrs, dict), op
    assert set(codegen.OPS["Clip"].attrs) == {"min", "max"} and set(codegen.OPS["Relu"].attrs) == set()


@pytest.mark.parametrize("mode", ["numpy", "numexpr", "loop"])
@pytest.mark.parametrize("attrs", [{"alpha": math.nan}, {"alpha": math.inf}, {"alpha": 0.25}],
                         ids=["nan", "inf", "finite"])
def test_attribute_values_never_become_source_text(mode, attrs):
    """Attributes are bound as objects (NumPy code), typed constants in the namespace (loops) or
    checked finite literals (numexpr, else NumPy code): NaN and inf included, results the same."""
    prog = codegen.dumps([("Neg", ["a0"], {}), ("LeakyRelu", ["t0"], attrs), ("Add", ["t1", "a0"], {})])
    x = np.linspace(-3, 3, 4096, dtype=np.float32).reshape(64, 64)
    fn = codegen.compile_program(prog, ["float32"], [x.shape], "float32", x.shape, mode=mode)
    src = getattr(fn, "source", "")
    for tok in ("alpha", "nan", "inf", "0.25"):
        assert tok not in src, (caps(fn).mode, src)
    a = np.float32(attrs["alpha"])
    with np.errstate(all="ignore"):
        want = np.where(-x >= 0, -x, a * -x) + x
        got = fn(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# the token helpers and the vocabulary check (ge_native.gensrc)
# ------------------------------------------------------------------------------------------------
VOCAB = gensrc.Vocabulary(names=frozenset({"f", "np"}), patterns=(r"t[0-9]+",), attributes=frozenset({"add"}),
                          keywords=frozenset({"out"}))
HOSTILE_SOURCES = [
    "t0 = f(t1, out=t2)\nx = 1",                       # a name outside the vocabulary
    "t0 = np.__class__",                               # a dunder attribute
    "t0 = np.system",                                  # an attribute outside it
    "t0 = f(t1, alpha=1)",                             # a keyword outside it
    "t0 = f(**t1)",                                    # ** unpacking
    "t0 = 'x'",                                        # a string
    "import os",                                       # an import
    "t0 = lambda: 0",                                  # a lambda
    "t0 = [t1 for t1 in t2]",                          # a comprehension
    "t0 = f'{t1}'",                                    # an f-string
    "# comment\nt0 = __import__",                      # a newline ends a comment
    "class t0: pass",                                  # a class
    "t0 = 1e999",                                      # an infinite literal
    "t0 = f(t1)\x00",                                  # not text
    "t0 = f(\u00e9)",                                  # non-ASCII
]


@pytest.mark.parametrize("src", HOSTILE_SOURCES)
def test_check_source_refuses_anything_outside_the_vocabulary(src):
    with pytest.raises(gensrc.SourceTokenError):
        gensrc.compile_checked(src, "<test>", VOCAB)


def test_check_source_accepts_its_vocabulary():
    code = gensrc.compile_checked("t0 = np.add(t1, t2, out=t3)\nt4 = f(t0) if t0 is not None else -1.5\n", "<t>", VOCAB)
    ns = {"np": np, "f": abs, "t1": 1.0, "t2": 2.0, "t3": None}
    exec(code, ns)  # noqa: S102 - checked
    assert ns["t4"] == 3.0


@pytest.mark.parametrize("bad", ["a b", "x)", "__init__", "for", "\u00e9", "", 3, None])
def test_ident_refuses_non_identifiers(bad):
    with pytest.raises(gensrc.SourceTokenError):
        gensrc.ident(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1", b"1", [1], 1j, np.float32(1)])
def test_literal_refuses_all_but_finite_numbers_bools_none(bad):
    with pytest.raises(gensrc.SourceTokenError):
        gensrc.literal(bad)


def test_literal_and_name_forms():
    assert [gensrc.literal(v) for v in (1, -2.5, True, None)] == ["1", "-2.5", "True", "None"]
    assert gensrc.name("t", 3) == "t3"
    for bad in (-1, True, "3", 1.0):
        with pytest.raises(gensrc.SourceTokenError):
            gensrc.name("t", bad)
    assert gensrc.label("g\nimport os; '") == "g_import_os___"


def test_window_loop_source_takes_only_a_known_kind_and_an_int():
    from ge_cpu.kernels import _window

    with pytest.raises(gensrc.SourceTokenError):
        _window.checked_source("conv\nimport os", 9)
    with pytest.raises(gensrc.SourceTokenError):
        _window.checked_source("max", "9")
    for kind in _window.KINDS:
        assert "kernel" in _window.checked_source(kind, 9)
        assert "kernel" in _window.checked_source(kind, None)


@pytest.mark.parametrize("bad", ['x = "a";', "x = 'a';", "/* c */", "// c", "#include <stdio.h>", "x = y \\\n;",
                                 "system(x);", "#pragma omp parallel for private(x)", "x = y @ z;"])
def test_native_source_check_refuses_strings_comments_directives_and_unknown_names(bad):
    from ge_native import native

    assert native.check_c("x = y + 1.5f;", {"x", "y"}) == "x = y + 1.5f;"
    with pytest.raises(native.NativeSourceError):
        native.check_c(bad, {"x", "y", "z"})


def test_sink_source_from_a_graph_with_hostile_names_matches_onnxruntime(canary):
    evil = f"x'] or {_payload(canary)} or feeds['"
    b = GraphBuilder(f"g\n{_payload(canary, 1)}")
    x = b.input(evil, "float32", (2, 8))
    v = b.op("Mul", x, b.const(np.full((2, 8), 1.5, np.float32)))
    v = b.op("Relu", b.op("Add", v, x))
    b.output(v)
    graph = b.build()
    model = ge.compile(graph, {"executor": "sink", "opt_level": 0})
    src = model.executable.source
    assert "feeds[n" in src and "'" not in src and "import" not in src
    feeds = {evil: np.linspace(-2, 2, 16, dtype=np.float32).reshape(2, 8)}
    want = run_onnxruntime(graph, feeds)
    got = model.run(feeds)
    np.testing.assert_allclose(list(got.values())[0], list(want.values())[0], rtol=1e-6)
    assert canary.triggered() is None
