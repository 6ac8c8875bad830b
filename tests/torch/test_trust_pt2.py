"""A .pt2 from outside is never unpickled and never runs code (issue 15, "pickle through loaders").

``torch.export.load`` unpickles the sample inputs (falling back to ``weights_only=False``),
pickled weights and constants, and evaluates strings of the program JSON (``sympy.sympify`` of
shape expressions, FX code generated from node names, targets resolved by ``getattr`` on the
``torch`` module). Each crafted archive below carries a payload that creates a canary file if
run; the frontend must refuse it (or ignore the part) and the canary must not exist.
"""

from __future__ import annotations

import json
import os
import pickle
import zipfile

import numpy as np
import pytest
import torch

import ge_core as ge
from ge_core.errors import ModelFileError


class _Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("shift", torch.arange(3, dtype=torch.float32))

    def forward(self, x):
        return torch.relu(self.lin(x)) + self.shift + torch.tensor([1.0, 2.0, 3.0])


class _Payload:
    """Unpickling this runs a shell command that creates the canary."""

    def __init__(self, canary: str) -> None:
        self.canary = canary

    def __reduce__(self):
        return (os.system, (f"touch {self.canary}",))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    model = _Small().eval()
    x = torch.randn(2, 4)
    path = os.fspath(tmp_path_factory.mktemp("pt2") / "small.pt2")
    torch.export.save(torch.export.export(model, (x,)), path)
    with torch.no_grad():
        ref = model(x).numpy()
    return path, x.numpy(), ref


def _entries(path: str) -> tuple[str, dict[str, bytes]]:
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        root = names[0].split("/", 1)[0] + "/"
        return root, {n[len(root):]: z.read(n) for n in names}


def _write(path: str, root: str, entries: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in entries.items():
            z.writestr(root + name, data)
    return path


def _crafted(saved, tmp_path, edit) -> str:
    root, entries = _entries(saved[0])
    edit(entries)
    return _write(os.fspath(tmp_path / "crafted.pt2"), root, entries)


def _program(entries) -> dict:
    return json.loads(entries["models/model.json"])


def _set_program(entries, prog) -> None:
    entries["models/model.json"] = json.dumps(prog).encode()


def test_real_pt2_loads_and_matches_torch(saved):
    path, x, ref = saved
    out = ge.compile(ge.load(path)).run({"x": x})
    np.testing.assert_allclose(next(iter(out.values())), ref, rtol=1e-5, atol=1e-6)


def test_loader_never_calls_torch_export_load(saved, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("torch.export.load unpickles: the frontend must not call it")

    monkeypatch.setattr(torch.export, "load", boom)
    monkeypatch.setattr(torch, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(pickle, "load", boom)
    ge.load(saved[0])


def test_pickled_sample_inputs_are_never_read(saved, tmp_path):
    canary = tmp_path / "canary_sample"

    def edit(e):
        e["data/sample_inputs/model.pt"] = pickle.dumps(_Payload(os.fspath(canary)), protocol=2)

    path = _crafted(saved, tmp_path, edit)
    out = ge.compile(ge.load(path)).run({"x": saved[1]})
    np.testing.assert_allclose(next(iter(out.values())), saved[2], rtol=1e-5, atol=1e-6)
    assert not canary.exists()


@pytest.mark.parametrize("folder,config", [("weights", "model_weights_config.json"),
                                           ("constants", "model_constants_config.json")])
def test_pickled_weight_or_constant_is_refused(saved, tmp_path, folder, config):
    canary = tmp_path / f"canary_{folder}"

    def edit(e):
        cfg = json.loads(e[f"data/{folder}/{config}"])
        meta = next(iter(cfg["config"].values()))
        meta["use_pickle"] = True
        e[f"data/{folder}/{meta['path_name']}"] = pickle.dumps(_Payload(os.fspath(canary)), protocol=2)
        e[f"data/{folder}/{config}"] = json.dumps(cfg).encode()

    with pytest.raises(ModelFileError, match="pickle") as err:
        ge.load(_crafted(saved, tmp_path, edit))
    assert "crafted.pt2" in str(err.value) and err.value.hint
    assert not canary.exists()


def test_opaque_object_constant_is_refused(saved, tmp_path):
    canary = tmp_path / "canary_opaque"

    def edit(e):
        cfg = json.loads(e["data/constants/model_constants_config.json"])
        meta = next(iter(cfg["config"].values()))
        meta["path_name"] = "opaque_obj_0"
        e["data/constants/opaque_obj_0"] = pickle.dumps(_Payload(os.fspath(canary)), protocol=2)
        e["data/constants/model_constants_config.json"] = json.dumps(cfg).encode()

    with pytest.raises(ModelFileError, match="pickle"):
        ge.load(_crafted(saved, tmp_path, edit))
    assert not canary.exists()


def test_legacy_pickled_weights_file_is_refused(saved, tmp_path):
    canary = tmp_path / "canary_legacy"

    def edit(e):
        e["data/weights/model.pt"] = pickle.dumps(_Payload(os.fspath(canary)), protocol=2)

    with pytest.raises(ModelFileError, match="legacy"):
        ge.load(_crafted(saved, tmp_path, edit))
    assert not canary.exists()


def _first_node(prog):
    return prog["graph_module"]["graph"]["nodes"][0]


def _rename_input(prog, old: str, new: str):
    text = json.dumps(prog).replace(f'"{old}"', json.dumps(new))
    return json.loads(text)


@pytest.mark.parametrize("case", ["placeholder_name", "node_name", "target", "expr_str", "kwarg_name"])
def test_program_strings_that_would_run_code_are_refused(saved, tmp_path, case):
    canary = os.fspath(tmp_path / f"canary_{case}")
    cmd = f"__import__('os').system('touch {canary}')"

    def edit(e):
        prog = _program(e)
        if case == "placeholder_name":  # FX writes placeholder targets into forward()'s signature
            prog = _rename_input(prog, "x", f"x={cmd}")
        elif case == "node_name":
            _first_node(prog)["name"] = f"linear = {cmd}\n    linear"
        elif case == "target":  # torch resolves "torch.os.system" by getattr from the torch module
            node = _first_node(prog)
            node["target"] = "torch.os.system"
            node["inputs"] = [{"name": "command", "arg": {"as_string": f"touch {canary}"}, "kind": 1}]
        elif case == "expr_str":  # sympy.sympify evaluates the string as Python
            tv = prog["graph_module"]["graph"]["tensor_values"]["x"]
            tv["sizes"][0] = {"as_expr": {"expr_str": cmd, "hint": {"as_int": 2}}}
        else:
            _first_node(prog)["inputs"][0]["name"] = f"input=({cmd})"
        _set_program(e, prog)

    with pytest.raises(ModelFileError, match="refused") as err:
        ge.load(_crafted(saved, tmp_path, edit))
    assert "crafted.pt2" in str(err.value)
    assert not os.path.exists(canary)


def test_stack_traces_and_guards_code_are_dropped(saved, tmp_path):
    canary = os.fspath(tmp_path / "canary_meta")
    cmd = f"__import__('os').system('touch {canary}')"

    def edit(e):
        prog = _program(e)
        for node in prog["graph_module"]["graph"]["nodes"]:
            node["metadata"]["stack_trace"] = f'File "m.py", line 1, in forward\n    x\n{cmd}\n'
            node["metadata"]["custom"] = json.dumps({"k": cmd})
        prog["guards_code"] = [cmd]
        _set_program(e, prog)

    graph = ge.load(_crafted(saved, tmp_path, edit))
    out = ge.compile(graph).run({"x": saved[1]})
    np.testing.assert_allclose(next(iter(out.values())), saved[2], rtol=1e-5, atol=1e-6)
    assert not os.path.exists(canary)


def test_expressions_torch_writes_are_accepted():
    from ge_torch.pt2 import check_sym_expr

    check_sym_expr("Mul(Integer(32), Symbol('s27', positive=True, integer=True))")
    check_sym_expr("Min(Integer(32), Max(Symbol('s52', positive=True, integer=True), Integer(2)))")
    check_sym_expr("FloorDiv(s0 + 1, 2)*Float('1.5', precision=53)")
    for bad in ("Symbol('os')", "s0.__class__", "Integer(9**999**99)", "PowByNatural(PowByNatural(99999, 99999), 9)",
                "Symbol('s0', exec=True)", "s0[0]", "open('x')", "s0; s1", "lambda: 0"):
        with pytest.raises(Exception) as err:
            check_sym_expr(bad)
        assert type(err.value).__name__ == "_Refused", bad


@pytest.mark.parametrize("case", ["not_zip", "truncated", "empty", "strides_past_end", "huge_size",
                                  "sizes_not_a_list", "int_param_with_grad", "bad_dtype", "bad_json",
                                  "no_program", "directory"])
def test_corrupt_archives_are_model_file_errors(saved, tmp_path, case):
    path = os.fspath(tmp_path / "bad.pt2")
    raw = open(saved[0], "rb").read()
    if case == "not_zip":
        open(path, "wb").write(b"not a zip at all" * 10)
    elif case == "truncated":
        open(path, "wb").write(raw[: len(raw) // 2])
    elif case == "empty":
        open(path, "wb").close()
    elif case == "directory":
        os.mkdir(path)
    else:
        root, e = _entries(saved[0])
        cfg = json.loads(e["data/weights/model_weights_config.json"])
        meta = cfg["config"]["lin.weight"]["tensor_meta"]
        if case == "strides_past_end":
            meta["strides"] = [{"as_int": 400}, {"as_int": 1}]
        elif case == "huge_size":
            meta["sizes"] = [{"as_int": 1 << 40}, {"as_int": 1 << 20}]
        elif case == "sizes_not_a_list":  # was a TypeError "bug in the frontend plugin" (pt2 fuzz target)
            meta["sizes"] = 5
        elif case == "int_param_with_grad":  # was torch's RuntimeError, "a bug in the frontend plugin"
            meta["dtype"] = 4  # ScalarType.INT: the 12 floats read as 12 int32, requires_grad kept
        elif case == "bad_dtype":
            meta["dtype"] = 999
        elif case == "bad_json":
            e["models/model.json"] = b"{" * 100000
        elif case == "no_program":
            del e["models/model.json"]
        e["data/weights/model_weights_config.json"] = json.dumps(cfg).encode()
        _write(path, root, e)
    with pytest.raises(ModelFileError) as err:
        ge.load(path)
    assert "bad.pt2" in str(err.value)


def _json_paths(x, pre=()):
    out = [pre]
    if isinstance(x, dict):
        for k, v in x.items():
            out += _json_paths(v, pre + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out += _json_paths(v, pre + (i,))
    return out


_FUZZ_VALUES = [None, 0, -1, 1 << 70, 2**63 - 1, 1.5, float("nan"), "", "x", "__class__", "torch.os.system",
                "a" * 5000, [], {}, [1, 2], {"as_int": 3}, {"as_expr": {"expr_str": "s0*2"}}, True,
                "Symbol('s0')", "-Infinity", "x=1", "s0\n__import__('os')"]


def test_mutated_programs_and_configs_never_raise_raw_exceptions(saved, tmp_path):
    """A small seeded campaign: random values put into, and keys removed from, the program JSON
    and the weights config. Each case loads or is a GEError (never a raw exception)."""
    import random

    from ge_core.errors import GEError

    root, entries = _entries(saved[0])
    rng = random.Random(15)
    raw = []
    rejected = 0
    for i in range(120):
        e = dict(entries)
        name = "models/model.json" if rng.random() < 0.8 else "data/weights/model_weights_config.json"
        d = json.loads(e[name])
        for _ in range(rng.randint(1, 3)):
            path = rng.choice([p for p in _json_paths(d) if p])
            cur = d
            for k in path[:-1]:
                cur = cur[k]
            if isinstance(cur, dict) and rng.random() < 0.3:
                del cur[path[-1]]
            else:
                cur[path[-1]] = rng.choice(_FUZZ_VALUES)
        e[name] = json.dumps(d).encode()
        try:
            ge.load(_write(os.fspath(tmp_path / "f.pt2"), root, e))
        except GEError:
            rejected += 1
        except Exception as ex:  # noqa: BLE001 - what the test looks for
            raw.append(f"case {i}: {type(ex).__name__}: {str(ex)[:200]}")
    assert not raw, "\n".join(raw)
    assert rejected > 0  # the mutations reach the loader's checks, not only harmless fields



def _patch_central_record(path: str, entry: str, out, fields: dict[int, tuple[str, int]]) -> str:
    """Write ``path`` to ``out`` with fields of the central-directory record of the entry whose
    name ends in ``entry`` overwritten: ``{offset in the record: (struct format, value)}``."""
    import struct

    raw = bytearray(open(path, "rb").read())
    at = raw.find(b"PK\x01\x02")
    while at >= 0:  # the entry's name follows the 46-byte fixed part of its record
        n = struct.unpack_from("<H", raw, at + 28)[0]
        if raw[at + 46: at + 46 + n].decode().endswith(entry):
            for off, (fmt, value) in fields.items():
                struct.pack_into(fmt, raw, at + off, value)
            out.write_bytes(bytes(raw))
            return os.fspath(out)
        at = raw.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"no entry {entry}")


def test_declared_entry_size_beyond_the_archive_allocates_nothing(saved, tmp_path):
    """A weight entry whose central-directory record declares 4 GiB of stored bytes: zipfile reads
    as many bytes as declared in one call, so the reader refuses the size before reading (the
    pt2 fuzz target's ``zip:sizes`` crash: a MemoryError under a capped address space)."""
    path = _patch_central_record(saved[0], "data/weights/weight_0", tmp_path / "lying.pt2",
                                 {20: ("<I", 2**32 - 1), 24: ("<I", 2**32 - 1)})  # compressed, uncompressed
    with pytest.raises(ModelFileError, match="more than the archive"):
        ge.load(path)


@pytest.mark.parametrize("entry,fields", [
    ("models/model.json", {6: ("<H", 115)}),  # "version needed to extract" 11.5: NotImplementedError
    ("data/weights/weight_0", {8: ("<H", 1)}),  # flagged as encrypted: RuntimeError
])
def test_zip_records_zipfile_cannot_read_are_model_file_errors(saved, tmp_path, entry, fields):
    """Found by the pt2 fuzz target: zipfile's NotImplementedError and RuntimeError came out as
    "a bug in the frontend plugin"."""
    with pytest.raises(ModelFileError, match="bad.pt2"):
        ge.load(_patch_central_record(saved[0], entry, tmp_path / "bad.pt2", fields))


def test_a_constant_of_a_dtype_ge_lacks_is_named_not_a_frontend_bug(tmp_path):
    """A float8 buffer (found by the pt2 fuzz campaign, case 9725) is an UnsupportedOpError
    naming the dtype, from a module and from a saved .pt2 alike."""
    from ge_core.errors import UnsupportedOpError

    class F8(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.full((4,), 0.5).to(torch.float8_e4m3fn))

        def forward(self, x):
            return x * self.scale.float()

    x = torch.ones(2, 4)
    with pytest.raises(UnsupportedOpError, match="float8_e4m3fn"):
        ge.load(F8(), example_inputs=(x,))
    path = str(tmp_path / "f8.pt2")
    torch.export.save(torch.export.export(F8(), (x,)), path)
    with pytest.raises(UnsupportedOpError, match="float8_e4m3fn"):
        ge.load(path)
