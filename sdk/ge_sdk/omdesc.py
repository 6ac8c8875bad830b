"""Descriptions of .om files: the container's header and partition table (:func:`describe`) and
the checked model summary ``ge inspect`` prints (:func:`inspect_om`, :func:`definition_summary`).

The loader's checks stay in the core (:mod:`ge_core.om`, :mod:`ge_core.om_container`); these
helpers only read and describe, as the ``ge inspect`` command (plugin ``ge_tools``) and the
``atc`` tool (plugin ``ge_atc``) show it.
"""

from __future__ import annotations

import os
from typing import Any

from ge_core.errors import OmFormatError, OptionError
from ge_core.ir.graph import Graph
from ge_core.om import call_kind, om_kind, read_model_definition, read_plan, read_streams, weight_buffers
from ge_core.om_container import read_container
from ge_core.options import CompileOptions
from ge_core.plugins import get_host
from ge_core.serialize import read_graph

RECREATE = "re-create it with `ge compile`"


def describe(path: str | os.PathLike[str], *, verify_checksums: bool = False) -> dict[str, Any]:
    """The header and partition table of the .om file at ``path`` as a JSON-able dict (the
    container is checked as :func:`ge_core.om_container.read_container` checks it)."""
    with read_container(path, verify_checksums=verify_checksums) as c:
        header = c.header
        entries = [c.info(k) for k in c.kinds()]
        path = c.path
    major, minor = header["format_version"]
    return {
        "path": path,
        "format_version": f"{major}.{minor}",
        "producer": header["producer"],
        "flags": header["flags"],
        "header_size": header["header_size"],
        "file_size": header["file_size"],
        "table_offset": header["table_offset"],
        "table_entry_size": header["table_entry_size"],
        "header_crc32": f"{header['header_crc32']:08x}",
        "table_crc32": f"{header['table_crc32']:08x}",
        "checksums_verified": verify_checksums,
        "partitions": [e.as_dict() for e in entries],
    }


def inspect_om(path: str) -> dict[str, Any]:
    """A JSON-able description: container header and partitions, model summary and report.

    The model definition is validated as :func:`ge_core.om.load_om` validates it (no plugin
    needed): the graph is rebuilt, the stream assignment and memory plan are read, the options
    are checked. A plugin's kind of .om is described by its :meth:`ge_core.om.OmKind.inspect`."""
    info: dict[str, Any] = {"file": describe(path)}
    with read_container(path) as c:
        found = om_kind(path, c, host=get_host())
        if found:
            info.update(call_kind(found, path, "inspect", c))
            return info
        d = read_model_definition(path, c)
        if "weights" not in c:
            raise OmFormatError(f"'{path}' has no weights partition", hint=RECREATE)
        info.update(definition_summary(path, d, weight_buffers(path, d, c)))
    return info


def definition_summary(path: str, d: dict[str, Any], blob: Any) -> dict[str, Any]:
    """``{"model", "report", "streams"}`` of :func:`inspect_om` for the definition ``d`` (its
    constants in ``blob``), validated as :func:`ge_core.om.load_om` validates it without plugins:
    the graph is rebuilt, the stream assignment and memory plan are read, the options are checked."""
    info: dict[str, Any] = {}
    g: Graph | None = read_graph(d.get("graph"), d.get("weights", []), blob, f"'{path}'")
    assert g is not None
    n = len(g.node_list())
    g = None  # its weights are views of a mapping about to close
    read_streams(d.get("streams"), n, path)
    read_plan(d.get("memory_plan"), path)
    try:
        options = CompileOptions.from_dict(d.get("options") or {})
    except OptionError as e:
        raise OmFormatError(f"'{path}': the stored compile options are invalid: {e.detail}", hint=RECREATE) from None
    gd: dict[str, Any] = d["graph"]
    info["model"] = {
        "producer": d.get("producer"),
        "inputs": gd.get("inputs", []),
        "outputs": gd.get("outputs", []),
        "nodes": len(gd.get("nodes", [])),
        "constants": len(gd.get("constants", [])),
        "opset_imports": gd.get("opset_imports"),
        "soc_version": options.soc_version,
    }
    if d.get("external_weights"):
        info["model"]["external_weights"] = d["external_weights"]
    info["report"] = d.get("report")
    info["streams"] = d.get("streams") or {}
    return info
