"""The new-plugin template behind ``ge new-plugin NAME``: a ready, tested plugin distribution.

The files it writes are package data, ``ge_sdk/templates/new_plugin/*.tmpl`` (``string.Template``
text: ``$dist`` is the distribution name, ``$pkg`` the package name).
"""

from __future__ import annotations

import keyword
import os
import re
from importlib import resources
from string import Template

from ge_core.errors import OptionError


def names(name: str) -> tuple[str, str]:
    """(distribution name, package name) for a plugin called ``name``."""
    pkg = re.sub(r"[^0-9a-zA-Z_]", "_", name.strip()).lower()
    if not re.fullmatch(r"[a-z][a-z0-9_]*", pkg) or keyword.iskeyword(pkg):
        raise OptionError(f"'{name}' cannot be a plugin name", hint="use letters, digits and underscores, e.g. my_plugin")
    if pkg.startswith("ge_") and pkg in ("ge_core", "ge_sdk", "ge_opset", "ge_onnx", "ge_cpu", "ge_passes",
                                          "ge_memory", "ge_streams", "ge_fusion", "ge_tensorflow"):
        raise OptionError(f"'{name}' is the name of a built-in package", hint="choose another name")
    return pkg.replace("_", "-"), pkg


def create(name: str, directory: str = ".", force: bool = False) -> str:
    """Write a new plugin distribution into ``directory/<dist>``; returns its path."""
    dist, pkg = names(name)
    root = os.path.join(directory, dist)
    from ge_core.writes import make_folder

    make_folder(root, "the plugin's folder")  # a file in the way, no permission: said with the path
    if os.listdir(root) and not force:
        raise OptionError(f"'{root}' already exists and is not empty", hint="choose another --dir or pass --force")
    files = {
        "pyproject.toml": "pyproject.toml.tmpl",
        "README.md": "README.md.tmpl",
        f"{pkg}/__init__.py": "__init__.py.tmpl",
        f"{pkg}/plugin.py": "plugin.py.tmpl",
        f"tests/test_{pkg}.py": "test_plugin.py.tmpl",
    }
    for rel, template in files.items():
        text = template_text(template)
        path = os.path.join(root, rel)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(Template(text).substitute(dist=dist, pkg=pkg))
        except OSError as e:
            from ge_core.errors import ModelFileError

            raise ModelFileError(f"cannot write '{path}': {e.strerror or e}",
                                 hint="choose a --dir this user can write") from None
    return root


def template_text(name: str) -> str:
    """The text of ``ge_sdk/templates/new_plugin/<name>`` (package data), ``$dist`` and ``$pkg``
    still to substitute."""
    return (resources.files("ge_sdk") / "templates" / "new_plugin" / name).read_text(encoding="utf-8")
