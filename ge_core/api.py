"""The public Python API: ``load``, ``compile``, ``quantize``, ``load_om``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .compiler import compile_graph
from .errors import GEError, ModelFileError, OptionError, reraise_interrupt
from .ir.graph import Graph
from .model import CompiledModel
from .om import load_om as load_om_file
from .om import save_om
from .options import CompileOptions
from .plugins import get_host
from .registry import close_matches

CompiledModel.compile_graph = staticmethod(compile_graph)
CompiledModel.save_om = staticmethod(save_om)

_HEAD = 64


def _frontend_for(source: Any, framework: str | None, regs):
    fronts = dict(regs.frontends.items())
    if framework:
        fw = framework.lower()
        for f in fronts.values():
            if f.name == fw or fw in (str(i) for i in f.framework_ids):
                return f
        raise OptionError(
            f"no frontend for framework '{framework}'{close_matches(fw, fronts)}",
            hint=f"installed frontends: {', '.join(sorted(fronts)) or 'none'}"
            + ("; install ge-python[tensorflow] for TensorFlow" if fw in ("tensorflow", "3") else ""),
        )
    if isinstance(source, (bytes, bytearray, memoryview)):
        # the serialized model itself: tell the format by its first bytes, as for a file
        head = bytes(source[:_HEAD])
        for f in fronts.values():
            try:
                if f.sniff("", head):
                    return f
            except BaseException as e:  # noqa: BLE001 - a frontend's sniff failing means: not its format
                reraise_interrupt(e)
                continue
        if head[:4] == b"GEOM":
            raise ModelFileError("these bytes are a compiled .om model, not a source model",
                                 hint="write them to a file and load it with ge.load_om")
        raise ModelFileError(f"cannot tell the format of {len(source)} bytes of model",
                             hint="give the framework (framework=...; installed: "
                                  f"{', '.join(sorted(fronts)) or 'none'})")
    if not isinstance(source, (str, os.PathLike)):
        for f in fronts.values():
            if f.accepts_object(source):
                return f
        raise ModelFileError(f"no frontend accepts an object of type {type(source).__name__}",
                             hint="pass a model file path or an object an installed frontend reads")
    path = os.fspath(source)
    head = b""
    if os.path.isfile(path):
        try:
            with open(path, "rb") as fh:
                head = fh.read(_HEAD)
        except OSError as e:
            raise ModelFileError(f"cannot read model file '{path}': {e.strerror}") from None
    for f in fronts.values():
        try:
            if f.sniff(path, head):
                return f
        except Exception:
            continue
    if not os.path.exists(path):
        raise ModelFileError(f"model file '{path}' does not exist", hint="check the path")
    if head[:4] == b"GEOM":
        raise ModelFileError(f"'{path}' is a compiled .om file, not a source model",
                             hint="run it with `ge run` or load it with ge.load_om")
    raise ModelFileError(
        f"cannot tell the format of '{path}'",
        hint=f"give the framework (--framework / framework=...; installed: {', '.join(sorted(fronts)) or 'none'})",
    )


def load(source: Any, framework: str | int | None = None, **options: Any) -> Graph:
    """Read a model into a :class:`Graph` with the frontend chosen by ``framework`` or file type.

    ``options`` are compile options the frontend understands (``input_shape``, ``out_nodes``).
    The source model is never modified.
    """
    host = get_host()
    opts = CompileOptions.from_any(options)
    if framework is not None:
        opts.update({"framework": framework})
    regs = host.registries
    if isinstance(source, (str, os.PathLike)):
        p = os.fspath(source)
        if "\0" in os.fsdecode(p):
            raise ModelFileError(f"model path {p!r} holds a NUL character", hint="check the path")
        if not os.path.exists(p):
            raise ModelFileError(f"model file '{p}' does not exist", hint="check the path")
    front = _frontend_for(source, opts.framework, regs)
    try:
        graph = front.load(source, opts)
    except GEError:
        raise
    except RecursionError:
        raise ModelFileError(f"model '{_label(source)}' is nested too deeply to read") from None
    except MemoryError:
        raise ModelFileError(f"model '{_label(source)}' needs more memory than is available to read") from None
    except BaseException as e:  # noqa: BLE001 - SystemExit in a frontend must not end the host
        reraise_interrupt(e)
        raise GEError(
            f"frontend '{front.name}' (plugin {regs.frontends.origin(front.name)}) failed on '{_label(source)}': "
            f"{type(e).__name__}: {e}",
            hint="this is a bug in the frontend plugin; please report it with the model",
        ) from e
    _refuse_internal_ops(graph, regs.ops.internal_domains(), _label(source), front.name)
    graph.metadata.setdefault("source", _label(source))
    graph.metadata.setdefault("framework", front.name)
    host.notify("ge_graph_loaded", graph=graph, source=source, framework=front.name)
    return graph


def _refuse_internal_ops(graph: Graph, internal: set[str], label: str, frontend: str) -> None:
    """A source model holding an op of a compiler-internal domain (a fused kernel, whose
    attributes steer generated code) is refused: only the compiler makes those, and only an .om
    (whose programs ``load_om`` validates) carries them. Subgraphs are walked too."""
    if not internal:
        return
    todo = [graph]
    while todo:
        g = todo.pop()
        for node in g.nodes:
            if node.domain in internal:
                raise ModelFileError(
                    f"model '{label}': {node.describe()} uses domain '{node.domain}', which is internal to the "
                    f"compiler (read by frontend '{frontend}')",
                    hint="a source model may not contain compiled (fused) ops; export the original model again",
                )
            todo.extend(node.subgraphs())


def _label(source: Any) -> str:
    if isinstance(source, (str, os.PathLike)):
        return os.fspath(source)
    return f"<{type(source).__name__}>"


def compile(model: Graph | Any, options: CompileOptions | dict | str | os.PathLike | None = None, *,
            progress: Callable[[str], None] | None = None, **overrides: Any) -> CompiledModel:
    """Compile a Graph (or anything :func:`load` reads) into a :class:`CompiledModel`.

    ``options``: a dict, :class:`CompileOptions` or a TOML config path; ``overrides`` win.
    ``progress(message)`` hears each stage and pass as it starts. The plugins' option readers
    (``ge_register_options``'s ``read=``) apply here, with the host's registries.
    """
    host = get_host()
    opts = CompileOptions.from_any(options, **overrides)
    opts.read_by_plugins(host.registries.option_readers)
    if isinstance(model, Graph):
        return compile_graph(model, opts, host, progress)
    # a graph of its own: compiled in place, so the weights a pass replaces are not held twice
    return compile_graph(load(model, opts.framework, **{k: v for k, v in (("input_shape", opts.input_shape),
                                                                          ("out_nodes", opts.out_nodes)) if v}),
                         opts, host, progress, owned=True)


def quantize(graph: Graph, calibration: Any = None, **options: Any) -> Graph:
    """A quantised (QDQ) copy of ``graph``, calibrated on ``calibration`` (an iterable of feed
    dicts), by the quantiser a plugin registers as the pass ``quantize`` (ge_quant's: options
    ``method``, ``per_channel``, ``activation_type``, ``skip_layers``, ``max_error``,
    ``percentile``, ``report``; ``weights_only=4|8`` needs no calibration; see docs/atc.md)."""
    return get_host().registries.passes.require("quantize", OptionError, " (the quantiser: is ge_quant installed?)").quantize(graph, calibration, **options)


def load_om(path: str | os.PathLike, *, verify_checksums: bool = True, threads: int | None = None,
            executor: str | None = None, **run_options: Any) -> CompiledModel:
    """Load a compiled .om file (read once into private memory, then validated: a snapshot that
    later changes to the file cannot reach). A plugin's kind
    of .om loads as the plugin's model, which has CompiledModel's interface: a gear model
    (``atc --dynamic_batch_size`` ...) as a :class:`ge_atc.gear_model.GearModel`.

    ``threads`` (how many threads a run uses), ``executor`` (the cpu backend's ``auto``, ``sink``,
    ``arena``, ``streams`` or ``sequential``) and other run options registered by plugins (the
    cpu backend's ``parallel``) replace the ones stored in the file; options that change what was
    compiled raise :class:`OptionError`. See :meth:`CompiledModel.set_run_options`.
    """
    t0 = time.perf_counter()
    if threads is not None:
        run_options["threads"] = threads
    if executor is not None:
        run_options["executor"] = executor
    model = load_om_file(path, host=get_host(), verify_checksums=verify_checksums, run_options=run_options)
    model.timings["load_seconds"] = round(time.perf_counter() - t0, 6)
    return model
