"""scripts/build_wheel.sh builds the ge-python wheel from the checkout (into a temporary folder,
nothing installed): it holds ge_core, ge_sdk and every built-in plugin with all their modules,
and the entry points pyproject.toml declares (console scripts, ge.plugins, pytest11, the torch
dynamo backend); its RECORD lists every file with its hash; no tests or caches come along."""

import base64
import configparser
import csv
import hashlib
import io
import os
import subprocess
import sys
import zipfile

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: the tomli dependency
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "build_wheel.sh"), str(out)], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    path = r.stdout.strip().splitlines()[-1]
    assert os.path.dirname(path) == str(out) and os.path.basename(path).startswith("ge_python-0.1.0-")
    assert not os.path.exists(os.path.join(ROOT, "build", "lib"))  # built in a copy, not in the tree
    return zipfile.ZipFile(path)


def _pyproject():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _dist_info(zf, name):
    (hit,) = [n for n in zf.namelist() if n.endswith(".dist-info/" + name) and n.count("/") == 1]
    return zf.read(hit).decode()


def test_the_wheel_holds_the_core_the_sdk_and_every_plugin(wheel):
    names = set(wheel.namelist())
    groups = _pyproject()["project"]["entry-points"]
    packages = {"ge_core", "ge_sdk"} | {mod.split(".")[0] for mod in groups["ge.plugins"].values()}
    assert {"ge_opset", "ge_onnx", "ge_cpu", "ge_fusion", "ge_tools"} <= packages
    for pkg in sorted(packages):
        base = os.path.join(ROOT, pkg) if pkg == "ge_core" else next(
            os.path.join(ROOT, top, pkg) for top in ("plugins", "sdk") if os.path.isdir(os.path.join(ROOT, top, pkg)))
        for dirpath, dirnames, files in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), os.path.dirname(base)).replace(os.sep, "/")
                    assert rel in names, f"{rel} is missing from the wheel"
    assert not [n for n in names if n.startswith(("tests/", "examples/", "bench/")) or "__pycache__" in n]


def test_the_entry_points_are_those_of_pyproject(wheel):
    project = _pyproject()["project"]
    ep = configparser.ConfigParser(delimiters=("=",))
    ep.optionxform = str  # keep names' case
    ep.read_string(_dist_info(wheel, "entry_points.txt"))
    assert dict(ep["console_scripts"]) == project["scripts"] and "ge" in ep["console_scripts"]
    for group, entries in project["entry-points"].items():
        assert {k: v for k, v in ep[group].items()} == entries, group
    assert ep["ge.plugins"]["ge_tools"] == "ge_tools.plugin"
    meta = _dist_info(wheel, "METADATA")
    assert "Name: ge-python" in meta and "Provides-Extra: torch" in meta


def test_the_record_lists_every_file_with_its_hash(wheel):
    rows = list(csv.reader(io.StringIO(_dist_info(wheel, "RECORD"))))
    listed = {r[0]: r[1] for r in rows}
    assert set(listed) == set(wheel.namelist())
    for name, digest in listed.items():
        if name.endswith("/RECORD"):
            assert digest == ""
            continue
        algo, _, want = digest.partition("=")
        h = hashlib.new(algo, wheel.read(name)).digest()
        assert base64.urlsafe_b64encode(h).rstrip(b"=").decode() == want, name
