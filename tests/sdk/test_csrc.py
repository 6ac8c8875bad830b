"""ge_native's fixed C (sdk/ge_native/csrc): every .c file compiles alone with -Wall -Werror under
the build's flags (and, on x86, for AVX2-only and baseline machines too), is ASCII, and is reached
named by the Python that reads it."""

from __future__ import annotations

import glob
import os
import platform
import re
import subprocess

import pytest

from ge_native import native

CSRC = native.CSRC
C_FILES = sorted(glob.glob(os.path.join(CSRC, "*.c")))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the machines the C must compile for besides this one: the AVX2 + FMA form and the plain one
OTHER_TARGETS = ["-march=haswell", "-march=x86-64"] if platform.machine() in ("x86_64", "AMD64") else []


def _syntax_flags(target: str | None = None) -> list[str]:
    flags = [f for f in native.build_flags() if f not in ("-shared", "-fPIC", "-undefined", "dynamic_lookup")]
    if target is not None:
        flags = [target if f == "-march=native" else f for f in flags]
    return ["-fsyntax-only", "-Wall", "-Werror", *flags, f"-I{CSRC}", *(f"-I{p}" for p in native.include_dirs())]


def _check(path: str, target: str | None = None) -> subprocess.CompletedProcess[str]:
    cc = native.compiler()
    assert cc is not None
    return subprocess.run([cc, *_syntax_flags(target), path], capture_output=True, text=True, timeout=300,
                          check=False)


needs_cc = pytest.mark.skipif(not native.available(), reason="no C compiler or Python/NumPy headers here")


def test_there_is_c_to_check():
    names = {os.path.basename(p) for p in C_FILES}
    assert {"pool.c", "sgemm.c", "gemm.c"} <= names
    assert any(n.startswith("nchwc") for n in names)
    for h in ("prelude.h", "activations.h", "activations16.h", "blas.h"):
        assert os.path.isfile(os.path.join(CSRC, h))


@needs_cc
@pytest.mark.parametrize("path", C_FILES, ids=os.path.basename)
def test_each_c_file_compiles_alone_without_a_warning(path):
    r = _check(path)
    assert r.returncode == 0, f"{os.path.basename(path)}:\n{r.stderr[-4000:]}"


@needs_cc
@pytest.mark.skipif(not OTHER_TARGETS, reason="the other targets are x86's")
@pytest.mark.parametrize("target", OTHER_TARGETS)
@pytest.mark.parametrize("path", C_FILES, ids=os.path.basename)
def test_each_c_file_compiles_for_other_machines(path, target):
    r = _check(path, target)
    assert r.returncode == 0, f"{os.path.basename(path)} ({target}):\n{r.stderr[-4000:]}"


@needs_cc
def test_the_check_fails_on_a_warning(tmp_path):
    bad = tmp_path / "bad.c"
    bad.write_text('#include "prelude.h"\nint ge_unused_demo(void) { int x; return 0; }\n')
    r = _check(str(bad))
    assert r.returncode != 0 and "unused" in r.stderr
    good = tmp_path / "good.c"
    good.write_text('#include "prelude.h"\nint ge_used_demo(void) { int x = 1; return x; }\n')
    assert _check(str(good)).returncode == 0


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(CSRC, "*.[ch]"))), ids=os.path.basename)
def test_each_file_is_ascii_with_a_valid_name(path):
    # build() writes the source as ASCII, and c_source reads only lower-case names
    with open(path, "rb") as f:
        f.read().decode("ascii")
    assert re.fullmatch(r"[a-z0-9_]{1,64}\.[ch]", os.path.basename(path))


def test_every_file_is_reached():
    """Each .c is named in the shipped Python (what c_source reads: a literal, or an f-string's
    pattern); each .h too, or is included by a csrc file (``prelude.h`` is what build() puts first)."""
    py = glob.glob(os.path.join(ROOT, "sdk", "**", "*.py"), recursive=True) \
        + glob.glob(os.path.join(ROOT, "plugins", "**", "*.py"), recursive=True)
    named: set[str] = set()
    patterns: list[re.Pattern[str]] = []
    for p in py:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        named.update(re.findall(r"[\"']([a-z0-9_]{1,64}\.[ch])[\"']", text))
        for pre, post in re.findall(r"[\"']([a-z0-9_]*)\{[^{}]*\}([a-z0-9_]*\.[ch])[\"']", text):
            patterns.append(re.compile(re.escape(pre) + r"[a-z0-9_]+" + re.escape(post)))
    included = {"prelude.h"}
    for p in glob.glob(os.path.join(CSRC, "*.[ch]")):
        with open(p, encoding="ascii") as f:
            included.update(re.findall(r'^\s*#\s*include\s+"([a-z0-9_]+\.h)"', f.read(), re.M))
    for p in glob.glob(os.path.join(CSRC, "*.[ch]")):
        name = os.path.basename(p)
        reached = name in named or any(q.fullmatch(name) for q in patterns) or name in included
        assert reached, f"csrc/{name} is named by no shipped Python (and included by no csrc file)"


def test_c_source_is_what_the_modules_compile():
    from ge_native import nchwc, sgemm

    act16 = native.c_source("activations16.h")
    assert native.c_source("sgemm.c").strip().startswith(act16.strip())  # the header expanded in place, once
    assert native.c_source("sgemm.c").count("sg_expcore16(__m512 xc") == 1
    assert "#include \"" not in native.c_source("nchwc.c")
    assert sgemm.ACTIVATION_C16 == act16 and sgemm.ACTIVATION_C == native.c_source("activations.h")
    assert nchwc.ACTIVATIONS is sgemm.ACTIVATIONS
    with open(os.path.join(CSRC, "prelude.h"), encoding="ascii") as f:
        assert native.PRELUDE == f.read()
