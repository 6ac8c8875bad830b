"""The files of a model: what happens when they change under a loaded model, how external weight
files are named, and how a save replaces a model (issue 42; docs/security.md, "When a loaded
model's files change").

* A loaded .om is a snapshot in private memory: rewriting its file in place (``cp`` over it,
  ``rsync --inplace``), truncating it or its weight files, replacing or deleting them never
  reaches it. These run in a child process, so a SIGBUS fails the test instead of ending pytest.
* Reloading a changed file is a clean GEError (checksum, size, missing file).
* External weight files are named per .om file name (``a b.om`` and ``a_b.om``, ``m.om`` and
  ``m`` never share one), and per save.
* A save over a model leaves the old model or the new one complete at every point: a failure
  injected at any step leaves the old model loading and running as before, with no file of the
  failed save left; after a save the previous version's weight files are gone, unless another
  .om in the folder names them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ge_core as ge
from ge_core.errors import GEError, ModelFileError, OmFormatError
from ge_core.om import WEIGHT_DIR, read_model_definition, save_om, weight_file_prefix
from ge_core.om_container import read_container, write_container
from ge_core.serialize import dump_definition

X = np.random.default_rng(7).standard_normal((2, 64)).astype(np.float32)


def _onnx(seed: int) -> bytes:
    """A small MLP whose weights span several pages (so a truncation drops mapped pages)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((64, 256)).astype(np.float32)
    b1 = rng.standard_normal(256).astype(np.float32)
    w2 = rng.standard_normal((256, 8)).astype(np.float32)
    f32 = TensorProto.FLOAT
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])],
        "mlp", [helper.make_tensor_value_info("x", f32, [2, 64])], [helper.make_tensor_value_info("y", f32, [2, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


@pytest.fixture(scope="module")
def models():
    """Two compiled models with different weights, and their results on X."""
    out = []
    for s in (0, 1):
        m = ge.compile(ge.load(_onnx(s), framework="onnx"))
        out.append((m, m.run({"x": X})["y"]))
    return out


def _run(path: str) -> np.ndarray:
    return ge.load_om(path).run({"x": X})["y"]


def _weight_files(folder) -> set[str]:
    d = os.path.join(folder, WEIGHT_DIR)
    return set(os.listdir(d)) if os.path.isdir(d) else set()


def _listed(path: str) -> list[str]:
    with read_container(path) as c:
        d = read_model_definition(path, c)
    return [f["path"] for f in (d.get("external_weights") or {}).get("files", [])]


# ------------------------------------------------------------------------------------------------
# files changed under a loaded model (in a child process: a SIGBUS must fail the test, not pytest)
# ------------------------------------------------------------------------------------------------
_CHILD = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import ge_core as ge
    from ge_core.errors import GEError

    cases = json.loads(sys.argv[1])
    x = np.load(sys.argv[2])
    loaded = {}
    for name, c in cases.items():
        m = ge.load_om(c["om"])
        loaded[name] = (m, m.run({"x": x})["y"])
    for name, c in cases.items():          # change every file after every model is loaded
        for rel, how in c["mutations"]:
            p = os.path.join(os.path.dirname(c["om"]), rel)
            size = os.path.getsize(p)
            if how == "truncate0":
                os.truncate(p, 0)
            elif how == "truncate_half":
                os.truncate(p, size // 2)
            elif how == "cp_over":          # what `cp other m.om` does: O_TRUNC, then write in place
                with open(c["other"], "rb") as f:
                    data = f.read()
                with open(p, "wb") as f:
                    f.write(data)
            elif how == "inplace":          # rsync --inplace / a disk error: same inode, other bytes
                with open(p, "r+b") as f:
                    for at in range(size // 2, size, 997):
                        f.seek(at)
                        f.write(b"\\xa5")
            elif how == "delete":
                os.unlink(p)
            else:
                raise SystemExit("unknown mutation " + how)
    out = {}
    for name, (m, first) in loaded.items():
        again = m.run({"x": x})["y"]            # the snapshot: must be exactly as before
        try:
            ge.load_om(cases[name]["om"]).run({"x": x})
            reload = "ok"
        except GEError as e:
            reload = type(e).__name__ + ": " + str(e)
        out[name] = {"same": bool(np.array_equal(first, again)), "reload": reload}
    print(json.dumps(out))
''')


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_a_loaded_model_survives_its_files_changing(tmp_path, models, mode):
    (m0, ref0), (m1, _) = models
    other = tmp_path / "other" / "o.om"
    other.parent.mkdir()
    save_om(m1, str(other))
    mutations = {"om_truncate0": [["m.om", "truncate0"]], "om_truncate_half": [["m.om", "truncate_half"]],
                 "om_cp_over": [["m.om", "cp_over"]], "om_inplace": [["m.om", "inplace"]],
                 "om_delete": [["m.om", "delete"]]}
    cases = {}
    for name in list(mutations):
        folder = tmp_path / name
        folder.mkdir()
        save_om(m0, str(folder / "m.om"), external_weight=mode)
        cases[name] = {"om": str(folder / "m.om"), "other": str(other), "mutations": mutations[name]}
    if mode:
        for how in ("truncate0", "truncate_half", "inplace", "delete", "cp_over"):
            folder = tmp_path / f"weights_{how}"
            folder.mkdir()
            save_om(m0, str(folder / "m.om"), external_weight=mode)
            rels = _listed(str(folder / "m.om"))
            cases[f"weights_{how}"] = {"om": str(folder / "m.om"), "other": str(other),
                                       "mutations": [[r, how] for r in rels]}
    np.save(tmp_path / "x.npy", X)
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases), str(tmp_path / "x.npy")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the child died (status {proc.returncode}; -7 is SIGBUS):\n{proc.stderr[-3000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, r in out.items():
        assert r["same"], f"{name}: the loaded model's results changed with its files"
    # a reload of a changed file is a clean GEError naming the file and the problem
    assert out["om_truncate0"]["reload"].startswith("OmFormatError") and "empty" in out["om_truncate0"]["reload"]
    assert out["om_truncate_half"]["reload"].startswith("OmFormatError")
    assert "truncated" in out["om_truncate_half"]["reload"]
    assert out["om_inplace"]["reload"].startswith("OmFormatError")
    assert "checksum" in out["om_inplace"]["reload"] or "corrupted" in out["om_inplace"]["reload"]
    assert out["om_delete"]["reload"].startswith("ModelFileError") and "no such file" in out["om_delete"]["reload"]
    assert out["om_cp_over"]["reload"] == "ok"  # another complete model now: it loads (as that model)
    if mode:
        assert "the model expects" in out["weights_truncate0"]["reload"]
        assert "the model expects" in out["weights_truncate_half"]["reload"]
        assert out["weights_inplace"]["reload"].startswith("OmFormatError")
        assert "checksum" in out["weights_inplace"]["reload"]
        assert out["weights_delete"]["reload"].startswith("ModelFileError")
        assert out["weights_cp_over"]["reload"].startswith("OmFormatError")
        for r in out.values():
            assert r["reload"] == "ok" or "m.om" in r["reload"]  # the message names the model


def test_the_loaded_weights_are_a_private_read_only_snapshot(tmp_path, models):
    (m0, ref0), _ = models
    for mode in (0, 2):
        path = str(tmp_path / f"m{mode}.om")
        save_om(m0, path, external_weight=mode)
        m = ge.load_om(path)
        consts = [v.const_value for v in m.graph.constants.values() if v.const_value.size > 1]
        assert consts and all(not c.flags.writeable and c.ctypes.data % 64 == 0 for c in consts)
        os.replace(path, path + ".moved")  # the model keeps nothing of the file: not even its name
        np.testing.assert_array_equal(m.run({"x": X})["y"], ref0)
        os.replace(path + ".moved", path)


def test_a_file_that_changes_size_while_read_is_a_clean_error(tmp_path, models, monkeypatch):
    from ge_core import om_container

    path = str(tmp_path / "m.om")
    save_om(models[0][0], path)
    real = om_container._open_regular

    def grew(p, *a):  # the size seen at open is not what the reads then find
        f, size = real(p, *a)
        return f, size + 4096

    monkeypatch.setattr(om_container, "_open_regular", grew)
    with pytest.raises(ModelFileError, match="changed while it was being read"):
        ge.load_om(path)

    def shrank(p, *a):
        f, size = real(p, *a)
        return f, size - 100

    monkeypatch.setattr(om_container, "_open_regular", shrank)
    with pytest.raises(ModelFileError, match="changed while it was being read"):
        ge.load_om(path)


# ------------------------------------------------------------------------------------------------
# names of external weight files
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.parametrize("names", [("a b.om", "a_b.om"), ("m.om", "m"), ("m.om", "m.bin"), ("M.om", "m.om"),
                                   ("x.y.om", "x_y.om")])
def test_two_models_in_one_folder_never_share_weight_files(tmp_path, models, mode, names):
    (m0, ref0), (m1, ref1) = models
    a, b = (str(tmp_path / n) for n in names)
    save_om(m0, a, external_weight=mode)
    save_om(m1, b, external_weight=mode)
    if os.path.samefile(a, b):  # a case-insensitive file system: one .om, the second save's, whole
        np.testing.assert_array_equal(_run(b), ref1)
        return
    assert not set(_listed(a)) & set(_listed(b))
    np.testing.assert_array_equal(_run(a), ref0)
    np.testing.assert_array_equal(_run(b), ref1)
    save_om(m1, a, external_weight=mode)  # re-saving one never touches the other's files
    np.testing.assert_array_equal(_run(a), ref1)
    np.testing.assert_array_equal(_run(b), ref1)
    assert weight_file_prefix(a) != weight_file_prefix(b)


def test_weight_file_names_are_readable_and_bounded(tmp_path, models):
    long = "n" * 200 + ".om"  # ge 0.1 named its weights "<200 n>.weights.bin": too long to load
    path = str(tmp_path / long)
    save_om(models[0][0], path, external_weight=2)
    (rel,) = _listed(path)
    name = rel.split("/")[1]
    assert name.startswith("n" * 64 + "-") and len(name) < 120
    np.testing.assert_array_equal(_run(path), models[0][1])
    assert weight_file_prefix(str(tmp_path / "résumé net.om")).startswith("r_sum__net-")


# ------------------------------------------------------------------------------------------------
# a save replaces a model atomically, and cleans up after itself
# ------------------------------------------------------------------------------------------------
def _fail_on(monkeypatch, which: str, after: int = 0):
    """Make the ``after``-th os.replace onto ``which`` ("om": the .om, "weight": a weight file) fail."""
    real = os.replace
    seen = {"n": 0}

    def replace(src, dst, *a, **kw):
        dst_s = os.fspath(dst)
        hit = dst_s.endswith(".om") if which == "om" else f"{os.sep}{WEIGHT_DIR}{os.sep}" in dst_s
        if hit:
            seen["n"] += 1
            if seen["n"] > after:
                raise OSError(28, "No space left on device")
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)


_MODES = [(0, 0), (1, 1), (2, 2), (2, 0), (0, 2), (1, 2), (2, 1)]


@pytest.mark.parametrize("old_mode,new_mode,where", [
    (o, n, w) for w in ("om", "weight", "weight_late", "container_writer") for o, n in _MODES
    if n or not w.startswith("weight")])  # an inline save writes no weight file
def test_a_failed_save_leaves_the_old_model_complete(tmp_path, models, monkeypatch, old_mode, new_mode, where):
    (m0, ref0), (m1, ref1) = models
    path = str(tmp_path / "m.om")
    save_om(m0, path, external_weight=old_mode)
    before = {n: (tmp_path / WEIGHT_DIR / n).read_bytes() for n in _weight_files(tmp_path)}
    om_bytes = (tmp_path / "m.om").read_bytes()
    with monkeypatch.context() as mp:
        if where == "container_writer":
            import ge_core.om as om_mod

            def broken(*a, **kw):
                raise ModelFileError("injected: the disk went away")

            mp.setattr(om_mod, "write_container", broken)
        else:
            _fail_on(mp, "om" if where == "om" else "weight", after=1 if where == "weight_late" and new_mode == 1 else 0)
        with pytest.raises(ModelFileError):
            save_om(m1, path, external_weight=new_mode)
    # the old model: its .om and weight files exactly as they were, nothing of the failed save left
    assert (tmp_path / "m.om").read_bytes() == om_bytes
    assert {n: (tmp_path / WEIGHT_DIR / n).read_bytes() for n in _weight_files(tmp_path)} == before
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    np.testing.assert_array_equal(_run(path), ref0)
    # and a save that goes through replaces it, leaving only the new version's files
    save_om(m1, path, external_weight=new_mode)
    np.testing.assert_array_equal(_run(path), ref1)
    assert _weight_files(tmp_path) == {r.split("/")[1] for r in _listed(path)}


def test_every_save_writes_new_names_and_removes_the_previous_ones(tmp_path, models):
    (m0, ref0), (m1, ref1) = models
    path = str(tmp_path / "m.om")
    seen = []
    for i, mode in enumerate([1, 1, 2, 2, 0, 1]):
        save_om((m0, m1)[i % 2], path, external_weight=mode)
        listed = {r.split("/")[1] for r in _listed(path)}
        assert _weight_files(tmp_path) == listed  # the previous version's files are gone
        assert not listed & set(seen)  # never a name an earlier version used
        seen.extend(listed)
        np.testing.assert_array_equal(_run(path), ((ref0, ref1)[i % 2]))


def test_a_copy_of_the_om_keeps_the_weight_files_it_names(tmp_path, models):
    (m0, ref0), (m1, ref1) = models
    path = str(tmp_path / "m.om")
    save_om(m0, path, external_weight=2)
    shutil.copy(path, tmp_path / "backup.om")  # names the same weight file
    save_om(m1, path, external_weight=2)
    np.testing.assert_array_equal(_run(path), ref1)
    np.testing.assert_array_equal(_run(str(tmp_path / "backup.om")), ref0)


def _to_legacy(path: str) -> list[str]:
    """Rewrite the .om at ``path`` (and rename its weight files) as ge 0.1 named them:
    ``weight/<stem>.weights.bin`` / ``weight/<stem>.w<i>.bin``."""
    import re

    folder = os.path.dirname(path)
    stem = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.splitext(os.path.basename(path))[0])
    with read_container(path) as c:
        d = read_model_definition(path, c)
    names = []
    for f in d["external_weights"]["files"]:
        new = f["path"].split("/")[1]
        legacy = f"{stem}.weights.bin" if new.endswith(".weights.bin") else f"{stem}.{new.split('.')[-2]}.bin"
        os.replace(os.path.join(folder, WEIGHT_DIR, new), os.path.join(folder, WEIGHT_DIR, legacy))
        f["path"] = f"{WEIGHT_DIR}/{legacy}"
        names.append(legacy)
    write_container(path, [("model", dump_definition(d, path), 8), ("weights", b"", 4096)], producer="ge-python 0.1.0")
    return names


@pytest.mark.parametrize("mode", [1, 2])
def test_models_saved_with_the_old_names_load_and_are_cleaned_up(tmp_path, models, mode):
    (m0, ref0), (m1, ref1) = models
    path = str(tmp_path / "a b.om")
    save_om(m0, path, external_weight=mode)
    legacy = _to_legacy(path)
    assert legacy[0].startswith("a_b.")
    np.testing.assert_array_equal(_run(path), ref0)  # the relative paths it records still work
    save_om(m1, path, external_weight=mode)
    np.testing.assert_array_equal(_run(path), ref1)
    assert not set(legacy) & _weight_files(tmp_path)  # no other model names them: removed


def test_old_names_another_model_uses_are_kept(tmp_path, models):
    """ge 0.1 gave ``a b.om`` and ``a_b.om`` the same weight file: re-saving one must not remove
    the file the other still loads."""
    (m0, ref0), (m1, ref1) = models
    a, b = str(tmp_path / "a b.om"), str(tmp_path / "a_b.om")
    save_om(m0, a, external_weight=2)
    _to_legacy(a)
    shutil.copy(a, b)  # the other model, naming the same legacy file
    save_om(m1, a, external_weight=2)
    np.testing.assert_array_equal(_run(a), ref1)
    np.testing.assert_array_equal(_run(b), ref0)


def test_a_save_never_removes_files_the_replaced_om_names_but_does_not_own(tmp_path, models):
    (m0, ref0), (m1, ref1) = models
    other = str(tmp_path / "other.om")
    save_om(m0, other, external_weight=2)
    (theirs,) = _listed(other)
    path = str(tmp_path / "m.om")
    save_om(m1, path, external_weight=2)
    with read_container(path) as c:  # a hostile or hand-made m.om naming other.om's weight file
        d = read_model_definition(path, c)
    d["external_weights"]["files"][0]["path"] = theirs
    write_container(path, [("model", dump_definition(d, path), 8), ("weights", b"", 4096)], producer="x")
    save_om(m1, path)
    assert os.path.exists(tmp_path / theirs)
    np.testing.assert_array_equal(_run(other), ref0)
    np.testing.assert_array_equal(_run(path), ref1)


def test_a_failed_save_of_a_new_file_leaves_nothing(tmp_path, models, monkeypatch):
    path = str(tmp_path / "new.om")
    _fail_on(monkeypatch, "om")
    with pytest.raises(ModelFileError, match="new.om"):
        save_om(models[0][0], path, external_weight=1)
    assert not os.path.exists(path) and not _weight_files(tmp_path)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_a_changed_external_weight_file_is_refused_at_load(tmp_path, models):
    path = str(tmp_path / "m.om")
    save_om(models[0][0], path, external_weight=2)
    (rel,) = _listed(path)
    p = tmp_path / rel
    data = bytearray(p.read_bytes())
    data[100] ^= 1
    p.write_bytes(bytes(data))
    with pytest.raises(OmFormatError, match="checksum") as e:
        ge.load_om(path)
    assert "m.om" in str(e.value) and rel in str(e.value)
    os.truncate(p, 10)
    with pytest.raises(GEError, match="the model expects"):
        ge.load_om(path)


def test_read_partition_reads_one_partition_checked(tmp_path, models):
    from ge_core.om_container import read_partition

    path = str(tmp_path / "m.om")
    save_om(models[0][0], path)
    with read_container(path) as c:
        expected = bytes(c.partition("model"))
    assert read_partition(path, "model", max_size=1 << 30) == expected
    assert read_partition(path, "model", max_size=len(expected) - 1) is None  # over the caller's bound
    assert read_partition(path, "nope", max_size=1 << 30) is None
    data = bytearray((tmp_path / "m.om").read_bytes())
    data[len(data) // 2] ^= 0xFF  # the weights partition: the model one still reads
    (tmp_path / "m.om").write_bytes(bytes(data))
    assert read_partition(path, "model", max_size=1 << 30) == expected
    data[20] ^= 0xFF  # the header: not an .om it can trust
    (tmp_path / "m.om").write_bytes(bytes(data))
    assert read_partition(path, "model", max_size=1 << 30) is None
    (tmp_path / "x.om").write_bytes(b"not an om")
    assert read_partition(str(tmp_path / "x.om"), "model", max_size=1 << 30) is None
    with pytest.raises(ModelFileError):
        read_partition(str(tmp_path / "missing.om"), "model", max_size=1 << 30)


def test_an_interrupt_after_the_switch_keeps_the_new_model_whole(tmp_path, models, monkeypatch):
    from ge_core import om_container

    (m0, _), (m1, ref1) = models
    path = str(tmp_path / "m.om")
    save_om(m0, path, external_weight=2)

    def interrupted(directory):  # write_container's last step, after the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(om_container, "fsync_directory", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_om(m1, path, external_weight=2)
    monkeypatch.undo()
    np.testing.assert_array_equal(_run(path), ref1)
