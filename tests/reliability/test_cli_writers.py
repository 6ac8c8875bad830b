"""What the ``ge`` and ``atc`` commands write (issue #42, "The user's files" and "Raw exceptions").

* every output goes through a temporary file beside it, synced and size-checked, then renamed:
  a full disk or a file-size limit fails with the path, exits non-zero and leaves no partial file;
* no writer option overwrites one of the command's inputs (the same name, a symbolic link, a
  hard link; an .om's external weight files, an ONNX model's external data), and the input is
  byte-identical afterwards;
* bad arguments are ``error: ...`` and a non-zero status, never a traceback.
"""

import errno
import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ge_core as ge
from ge_core.cli import main as ge_main
from ge_core.errors import ModelFileError
from ge_core.writes import InputFiles, write_all_atomic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _model(path, shape=(2, 3), *, two_outputs=False, names=("x", "y", "z"), external=None):
    x, y, z = names
    w = numpy_helper.from_array(np.ones([1 if isinstance(d, str) else d for d in shape], np.float32), "w")
    nodes = [helper.make_node("Add", [x, "w"], [y]), helper.make_node("Relu", [y], [z])]
    outs = [helper.make_tensor_value_info(z, TensorProto.FLOAT, list(shape))]
    if two_outputs:
        nodes.append(helper.make_node("Sigmoid", [y], ["s"]))
        outs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, list(shape)))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT, list(shape))], outs,
                          initializer=[w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    if external:
        onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=external,
                        size_threshold=0)
    else:
        onnx.save(m, str(path))
    return str(path)


def _ge(capsys, *args):
    """``ge ARGS`` in this process: (status, stdout, stderr)."""
    capsys.readouterr()
    rc = ge_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _clean_error(rc, err, *needles):
    assert rc == 2, (rc, err)
    assert err.startswith("error: ") and "Traceback" not in err and "internal error" not in err, err
    for n in needles:
        assert n in err, (n, err)


def _digest(*paths):
    return {str(p): hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("writers")
    src = _model(d / "m.onnx")
    two = _model(d / "two.onnx", (256, 1024), two_outputs=True)
    dyn = _model(d / "dyn.onnx", ("N", 3))
    for s in (src, two, dyn):
        assert ge_main(["compile", s, "-o", s[:-5] + ".om", "-q"]) == 0
    return {"dir": d, "src": src, "om": str(d / "m.om"), "two": str(d / "two.om"), "dyn": str(d / "dyn.om")}


# ------------------------------------------------------------------------------------------------
# 1. ge run --output-dir on a full disk
# ------------------------------------------------------------------------------------------------
def _failing_save(fail_on):
    """np.save that writes half of the ``fail_on``-th array, then fails as a full disk does."""
    real = np.save
    calls = []

    def save(f, arr, *a, **kw):
        calls.append(1)
        if len(calls) == fail_on:
            f.write(b"\x93NUMPY" + b"\0" * 64)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(f, arr, *a, **kw)

    return save


@pytest.mark.parametrize("fail_on", [1, 2])
def test_run_output_dir_on_a_full_disk_fails_and_leaves_no_partial_file(models, tmp_path, capsys, monkeypatch,
                                                                        fail_on):
    out = tmp_path / "out"
    monkeypatch.setattr(np, "save", _failing_save(fail_on))
    rc, stdout, err = _ge(capsys, "run", models["two"], "--output-dir", out)
    _clean_error(rc, err, "No space left on device", str(out))
    assert "->" not in stdout  # nothing is said to be written
    assert os.listdir(out) == []  # neither the half file nor the complete first one nor a temporary file


def test_run_output_dir_failure_keeps_the_previous_files(models, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert _ge(capsys, "run", models["two"], "--output-dir", out)[0] == 0
    before = _digest(*sorted(out.iterdir()))
    monkeypatch.setattr(np, "save", _failing_save(2))
    rc, _, err = _ge(capsys, "run", models["two"], "--output-dir", out, "--seed", 3)
    _clean_error(rc, err, "No space left on device")
    assert _digest(*sorted(out.iterdir())) == before


def test_run_output_dir_past_a_file_size_limit_end_to_end(models, tmp_path):
    """A real short write: RLIMIT_FSIZE makes writes past 100 kB fail with EFBIG (SIGXFSZ ignored)."""
    out = tmp_path / "out"
    code = textwrap.dedent(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        from ge_core.cli import main
        sys.exit(main(["run", {models['two']!r}, "--output-dir", {str(out)!r}]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("error: cannot write output file") and str(out) in r.stderr, r.stderr
    assert "->" not in r.stdout
    assert os.listdir(out) == []


def test_write_all_atomic_checks_the_size_that_reached_the_disk(tmp_path, monkeypatch):
    real_fstat = os.fstat

    class Short:
        def __init__(self, st):
            self.st = st

        def __getattr__(self, k):
            return self.st.st_size - 1 if k == "st_size" else getattr(self.st, k)

    monkeypatch.setattr(os, "fstat", lambda fd: Short(real_fstat(fd)))
    with pytest.raises(ModelFileError, match="reached the disk"):
        write_all_atomic([(tmp_path / "a.bin", lambda f: f.write(b"abc"))], "the file")
    assert os.listdir(tmp_path) == []


# ------------------------------------------------------------------------------------------------
# 2. no writer overwrites one of the command's inputs
# ------------------------------------------------------------------------------------------------
def _link(kind, target, where):
    """``target`` itself, or a symbolic / hard link to it at ``where``."""
    if kind == "same":
        return target
    (os.symlink if kind == "symlink" else os.link)(target, where)
    return str(where)


WRITERS = [  # (name, argv with {src} / {om} / {out}, which input {out} links to, the flag named)
    ("compile -o", ["compile", "{src}", "-o", "{out}", "-q"], "src_as_om", "-o/--output"),
    ("compile --report", ["compile", "{src}", "-o", "{tmp}/x.om", "--report", "{out}", "-q"], "src", "--report"),
    ("compile --dump-ir", ["compile", "{src}", "-o", "{tmp}/x.om", "--dump-ir", "{out}", "-q"], "src", "--dump-ir"),
    ("run --output-dir", ["run", "{om}", "--output-dir", "{out}"], "om", "--output-dir"),
    ("run --dump-tensors", ["run", "{om}", "--dump-tensors", "{out}"], "om", "--dump-tensors"),
    ("inspect --memory-plot", ["inspect", "{om}", "--memory-plot", "{out}"], "om", "--memory-plot"),
    ("memory-plot", ["memory-plot", "{om}", "{out}"], "om", "memory plot"),
    ("export -o", ["export", "{om}", "-o", "{out}", "-q"], "om", "-o/--output"),
    ("profile --trace", ["profile", "{om}", "--trace", "{out}", "--runs", "1"], "om", "--trace"),
    ("viz -o", ["viz", "{src}", "-o", "{out}"], "src", "-o/--output"),
    ("compare --repro", ["compare", "{src}", "--bisect-passes", "--repro", "{out}"], "src", "--repro"),
    ("atc --output", ["atc", "--model={src}", "--output={out}"], "src_as_om", "--output"),
    ("atc --report", ["atc", "--model={src}", "--output={tmp}/x", "--report={out}"], "src", "--report"),
    ("atc --json", ["atc", "--mode=1", "--om={om}", "--json={out}"], "om", "--json"),
    ("atc --check_report", ["atc", "--mode=3", "--model={src}", "--check_report={out}"], "src", "--check_report"),
]


#: every writer x every way of naming the input; an .om output path always ends in .om, so only a
#: link named so can be the source model itself (no "same" case for those)
WRITER_CASES = [pytest.param(kind, *w, id=f"{w[0]}-{kind}") for w in WRITERS
                for kind in ("same", "symlink", "hardlink") if not (w[2] == "src_as_om" and kind == "same")]


@pytest.mark.parametrize("kind,name,argv,which,flag", WRITER_CASES)
def test_writers_refuse_the_commands_own_input(models, tmp_path, capsys, name, argv, which, flag, kind):
    src = _model(tmp_path / "src.onnx")
    om = str(tmp_path / "src.om")
    assert ge_main(["compile", src, "-o", om, "-q"]) == 0
    target = {"src": src, "om": om, "src_as_om": src}[which]
    out = _link(kind, target, tmp_path / ("link.om" if target.endswith(".om") or which == "src_as_om" else "link.onnx"))
    before = _digest(src, om)
    args = [a.format(src=src, om=om, out=out, tmp=tmp_path) for a in argv]
    rc, _, err = _ge(capsys, *args)
    _clean_error(rc, err, flag, "input")
    assert os.path.basename(target) in err  # both paths are named
    assert _digest(src, om) == before
    assert os.path.lexists(out)  # the link itself is left too
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_an_om_s_external_weight_files_are_inputs_too(tmp_path, capsys):
    src = _model(tmp_path / "m.onnx")
    assert _ge(capsys, "atc", f"--model={src}", f"--output={tmp_path}/ext", "--external_weight=2")[0] == 0
    weights = [str(p) for p in (tmp_path / "weight").iterdir()]
    assert weights
    before = _digest(*weights)
    for argv in (["export", tmp_path / "ext.om", "-o", weights[0]],
                 ["profile", tmp_path / "ext.om", "--trace", weights[0], "--runs", "1"],
                 ["inspect", tmp_path / "ext.om", "--memory-plot", weights[0]]):
        rc, _, err = _ge(capsys, *argv)
        _clean_error(rc, err, "is an input of this command", weights[0])
    assert _digest(*weights) == before
    assert InputFiles(tmp_path / "ext.om").input_of(weights[0]) == weights[0]


def test_an_onnx_model_s_external_data_is_an_input_too(tmp_path, capsys):
    src = _model(tmp_path / "m.onnx", external="m.weights")
    data = str(tmp_path / "m.weights")
    before = _digest(src, data)
    for argv in (["compile", src, "-o", tmp_path / "x.om", "--report", data, "-q"], ["viz", src, "-o", data],
                 ["atc", f"--model={src}", f"--output={tmp_path}/x", f"--report={data}"]):
        rc, _, err = _ge(capsys, *argv)
        assert rc == 2 and "is an input of this command" in err and "m.weights" in err, err
    assert _digest(src, data) == before


def test_run_output_dir_refuses_a_feed_file_it_would_overwrite(models, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    feed = out / "z.npy"  # the name output 'z' is saved under
    np.save(feed, np.zeros((2, 3), np.float32))
    before = _digest(feed)
    rc, _, err = _ge(capsys, "run", models["om"], "--input", f"x={feed}", "--output-dir", out)
    _clean_error(rc, err, "--output-dir", "z.npy", "input")
    assert _digest(feed) == before


def test_two_outputs_of_one_command_may_not_name_the_same_file(models, tmp_path, capsys):
    out = tmp_path / "x.om"
    rc, _, err = _ge(capsys, "compile", models["src"], "-o", out, "--report", out, "-q")
    _clean_error(rc, err, "name the same file")
    assert not out.exists()


def test_dump_ir_through_the_api_never_writes_over_the_source(tmp_path):
    src = _model(tmp_path / "000_input.txt")  # named as the first dump file would be
    before = _digest(src)
    with pytest.raises(ModelFileError, match="input"):
        ge.compile(src, {"dump_ir": str(tmp_path), "framework": "onnx"})
    assert _digest(src) == before


# ------------------------------------------------------------------------------------------------
# 3. raw exceptions that are now errors with a message
# ------------------------------------------------------------------------------------------------
def test_run_random_with_a_huge_input_shape_is_refused_before_allocating(models, capsys):
    rc, _, err = _ge(capsys, "run", models["dyn"], "--random", "--input-shape", "x:100000000000,3")
    _clean_error(rc, err, "'x'", "1,200,000,000,000 bytes", "--input-shape")


def test_bench_with_a_huge_input_shape_is_refused_before_allocating(models, capsys):
    rc, _, err = _ge(capsys, "bench", models["dyn"], "--input-shape", "x:100000000000,3", "--runs", "1")
    _clean_error(rc, err, "'x'", "1,200,000,000,000 bytes")


@pytest.mark.parametrize("where", ["file/sub", "file"])
def test_dump_ir_to_an_unwritable_path_is_an_error(models, tmp_path, capsys, where):
    (tmp_path / "file").write_text("a file")
    rc, _, err = _ge(capsys, "compile", models["src"], "-o", tmp_path / "x.om", "--dump-ir", tmp_path / where, "-q")
    _clean_error(rc, err, "dump", str(tmp_path / "file"), "not a folder")
    assert (tmp_path / "file").read_text() == "a file"


def test_inspect_memory_plot_with_an_unknown_image_format_lists_the_formats(models, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    import ge_memory.plot

    monkeypatch.setattr(ge_memory.plot, "plot_plan", lambda *a, **k: pytest.fail("drawn before the check"))
    out = tmp_path / "X.xyz"
    rc, _, err = _ge(capsys, "inspect", models["om"], "--memory-plot", out)
    _clean_error(rc, err, "X.xyz", "'.xyz' is not an image format", ".png", ".svg")
    assert not out.exists()


@pytest.mark.parametrize("names", [("in put", "a.b", "c/d"), ("入力", "ñ", "出力"), ("0", "1", "2"),
                                   ("x" * 2000, "y" * 4000, "z" * 3000), ("feeds", "_r", "v0")],
                         ids=["spaces-dots-slashes", "unicode", "digits", "long", "generator-names"])
@pytest.mark.parametrize("shape", [(2, 3), ("N", 3)], ids=["static", "symbolic"])
def test_inspect_source_of_sunk_models_with_unusual_value_names(tmp_path, capsys, names, shape):
    src = _model(tmp_path / "m.onnx", shape, names=names)
    om = tmp_path / "m.om"
    assert _ge(capsys, "compile", src, "-o", om, "-q", "--option", "executor=sink")[0] == 0
    rc, out, err = _ge(capsys, "inspect", om, "--source")
    assert rc == 0 and "def run0(feeds):" in out, err
    assert all(n not in out for n in names if not n.isidentifier() and not n.isdigit())  # names are no code


def test_inspect_source_without_generated_code_says_why(tmp_path, capsys):
    src = _model(tmp_path / "m.onnx", ("N", 3), names=("a b", "c", "d"))
    om = tmp_path / "m.om"
    assert _ge(capsys, "compile", src, "-o", om, "-q", "-O", "0", "--option", "executor=sink")[0] == 0
    rc, out, err = _ge(capsys, "inspect", om, "--source")
    if rc == 0:
        assert "def run0(feeds):" in out
    else:
        _clean_error(rc, err, "m.om", "no generated source", "symbolic", "--input-shape")


def test_inspect_source_of_a_gear_model_prints_every_gear(tmp_path, capsys):
    src = _model(tmp_path / "dyn.onnx", ("N", 3))
    assert _ge(capsys, "atc", f"--model={src}", f"--output={tmp_path}/g", "--input_shape=x:-1,3",
               "--dynamic_batch_size=1,2")[0] == 0
    rc, out, err = _ge(capsys, "inspect", tmp_path / "g.om", "--source")
    assert rc == 0, err
    assert out.count("def run0(feeds):") == 2 and "batch 2" in out


# ------------------------------------------------------------------------------------------------
# 4. bad arguments found by the audit
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", ["run", "bench", "compare"])
def test_a_negative_seed_is_an_option_error(models, capsys, cmd):
    more = ["--runs", "1"] if cmd == "bench" else []
    rc, _, err = _ge(capsys, cmd, models["om"] if cmd != "compare" else models["src"], "--seed", "-1", *more)
    _clean_error(rc, err, "--seed -1")


@pytest.mark.parametrize("where", ["file", "missing/deeper"])
def test_new_plugin_into_a_bad_folder_is_an_error(tmp_path, capsys, where):
    (tmp_path / "file").write_text("x")
    rc, _, err = _ge(capsys, "new-plugin", "my_thing", "--dir", tmp_path / where)
    if where == "file":
        _clean_error(rc, err, "is a file, not a folder")
    else:  # missing parents are created
        assert rc == 0, err


@pytest.mark.parametrize("out", ["adir", "adir/"])
def test_compile_into_a_folder_writes_model_om_there(models, tmp_path, capsys, out):
    (tmp_path / "adir").mkdir()
    rc, _, err = _ge(capsys, "compile", models["src"], "-o", f"{tmp_path}/{out}", "-q")
    assert rc == 0, err
    assert os.listdir(tmp_path / "adir") == ["m.om"]


@pytest.mark.parametrize("argv,needle", [
    (["compile", "{src}", "-o", "{tmp}/missing/x.om", "-q"], "does not exist"),
    (["compile", "{src}", "-o", "{tmp}/file/x.om", "-q"], "is a file, not a folder"),
    (["compile", "{src}", "--report", "{tmp}/adir", "-o", "{tmp}/y.om", "-q"], "it is a folder"),
    (["run", "{om}", "--output-dir", "{tmp}/file"], "is a file, not a folder"),
    (["run", "{om}", "--dump-tensors", "{tmp}/file/sub"], "is a file, not a folder"),
    (["profile", "{om}", "--trace", "{tmp}/adir", "--runs", "1"], "it is a folder"),
    (["profile", "{om}", "--trace", "{tmp}/missing/t.json", "--runs", "1"], "does not exist"),
    (["export", "{om}", "-o", "{tmp}/adir"], "it is a folder"),
    (["viz", "{om}", "-o", "{tmp}/missing/x.svg"], "does not exist"),
    (["memory-plot", "{om}", "{tmp}/adir"], "adir"),
    (["atc", "--mode=1", "--om={om}", "--json={tmp}/adir"], "it is a folder"),
    (["atc", "--model={src}", "--output={tmp}/missing/x"], "does not exist"),
    (["atc", "--mode=3", "--model={src}", "--check_report={tmp}/file/r.json"], "is a file, not a folder"),
])
def test_output_paths_that_cannot_be_written_are_errors(models, tmp_path, capsys, argv, needle):
    (tmp_path / "file").write_text("x")
    (tmp_path / "adir").mkdir()
    args = [a.format(src=models["src"], om=models["om"], tmp=tmp_path) for a in argv]
    rc, _, err = _ge(capsys, *args)
    _clean_error(rc, err, needle)
    assert (tmp_path / "file").read_text() == "x"


def test_guard_reports_out_of_memory_and_file_errors_without_a_traceback(capsys, monkeypatch):
    from ge_core.cli import guard

    monkeypatch.delenv("GE_DEBUG", raising=False)

    def fail(e):
        def fn():
            raise e
        return fn

    assert guard(fail(MemoryError())) == 2
    assert capsys.readouterr().err.startswith("error: out of memory")
    assert guard(fail(OSError(errno.ENOSPC, "No space left on device", "/data/out.bin"))) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: '/data/out.bin': No space left on device"), err
    assert guard(fail(OSError("a socket closed"))) == 3  # no file named: a bug to report
    assert capsys.readouterr().err.startswith("internal error")


def test_a_device_output_is_written_into_never_renamed_over(models, tmp_path, capsys):
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []

    import threading

    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())

    t = threading.Thread(target=read)
    t.start()
    rc, _, err = _ge(capsys, "compile", models["src"], "-o", tmp_path / "x.om", "--report", fifo, "-q")
    t.join(30)
    assert rc == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and b'"nodes_before"' in got[0]
    assert _ge(capsys, "compile", models["src"], "-o", tmp_path / "x.om", "--report", os.devnull, "-q")[0] == 0
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_output_dir_and_dump_tensors_may_share_a_folder(models, tmp_path, capsys):
    rc, _, err = _ge(capsys, "run", models["om"], "--output-dir", tmp_path / "d", "--dump-tensors", tmp_path / "d")
    assert rc == 0, err
    assert sorted(os.listdir(tmp_path / "d")) == ["index.json", "z.npy"]


@pytest.mark.parametrize("opt", [[], ["-O", "0"]])
def test_a_sunk_model_whose_output_is_an_input_runs(tmp_path, capsys, opt):
    """A graph output that is a graph input no node reads (a pass-through named 'in put'): the
    generated code read it from the feeds only when a step did (NameError, exit 2)."""
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [vi("x", TensorProto.FLOAT, [2, 3]), vi("in put", TensorProto.FLOAT, [2, 3])],
                          [vi("y", TensorProto.FLOAT, [2, 3]), vi("in put", TensorProto.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(tmp_path / "p.onnx"))
    assert _ge(capsys, "compile", tmp_path / "p.onnx", "-o", tmp_path / "p.om", "-q", *opt)[0] == 0
    rc, out, err = _ge(capsys, "inspect", tmp_path / "p.om", "--source")
    assert rc == 0 and "feeds[n" in out, err
    np.save(tmp_path / "x.npy", np.full((2, 3), -1, np.float32))
    np.save(tmp_path / "p.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    rc, out, err = _ge(capsys, "run", tmp_path / "p.om", "--input", f"x={tmp_path / 'x.npy'}",
                       "--input", f"in put={tmp_path / 'p.npy'}", "--output-dir", tmp_path / "o")
    assert rc == 0, err
    np.testing.assert_array_equal(np.load(tmp_path / "o" / "in_put.npy"), np.arange(6).reshape(2, 3))
