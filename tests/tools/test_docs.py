"""docs/tools.md runs as written: every `$ ...` command of its console blocks (in a folder with
the models tests.tools.models writes and onnx's light_resnet50) exits 0 and prints lines that
start as the page shows, and its Python example prints what the page shows."""

import os
import shutil
import subprocess
import sys

from tests.conftest import light_model_path
from tests.tools.models import bert_like, matmul_chain, resnet_like

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "tools.md")


def _blocks(kind):
    """The fenced blocks of the page whose info string is ``kind`` ("" for a bare fence)."""
    blocks, current, lang = [], None, None
    for line in open(PAGE, encoding="utf-8").read().splitlines():
        if line.lstrip().startswith("```"):
            if current is None:
                current, lang = [], line.strip()[3:]
            else:
                if lang == kind:
                    blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def _console_steps():
    """(command, expected output lines) for every `$` line of the console blocks."""
    steps = []
    for block in _blocks("console"):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps and line.strip():
                steps[-1][1].append(line)
    return steps


def test_every_command_of_docs_tools_runs_as_written(tmp_path):
    for fn in (matmul_chain, resnet_like, bert_like):
        fn(str(tmp_path / f"{fn.__name__}.onnx"))
    shutil.copy(light_model_path("resnet50"), tmp_path / "light_resnet50.onnx")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    steps = _console_steps()
    assert len(steps) >= 10
    for cmd, expected in steps:
        r = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])
        got = [x.strip() for x in (r.stdout + r.stderr).splitlines()]
        for want in expected:
            head = want.split()[0]
            assert any(x.startswith(head) for x in got), (cmd, want, got[:20])
    (example,) = [b for b in _blocks("python") if "AsyncRunner" in b]
    (shown,) = [b for b in _blocks("") if b.startswith("[NodeArg(")]
    r = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == shown, (r.stdout, shown)
