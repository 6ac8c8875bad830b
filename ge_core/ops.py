"""Op definitions: the schema, inference and fusion kind of an op, and their registry."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import GEError, GraphError, PluginError, ShapeInferenceError, UnsupportedOpError, reraise_interrupt
from .ir.graph import Graph, Node, declare_copy_op
from .ir.types import TensorType
from .registry import Registry, close_matches


class OpKind(enum.IntEnum):
    """How an op composes for automatic fusion (TVM's pattern kinds, in the same order)."""

    ELEMWISE = 0  #: output[i] depends only on input[i], same shapes
    BROADCAST = 1  #: elementwise with broadcasting
    INJECTIVE = 2  #: each output element reads one input element (reshape, transpose, slice)
    REDUCTION = 3  #: reduces along axes
    OUT_ELEMWISE_FUSABLE = 4  #: complex op whose output can take fused elementwise ops (conv)
    TUPLE = 7
    OPAQUE = 8  #: not fusible


#: How an op's output 0 may share the bytes of its inputs (``OpDef.alias``), which the memory
#: problem (:func:`ge_core.memory.build_problem`) reads:
#: ``"view"``: it is the bytes of input 0 in C order (Reshape); ``"inplace"``: elementwise, it may
#: be written over an input of its type whose bytes nobody reads later; ``"concat"``: its inputs
#: lie back to back in it when its dims before ``axis`` are all 1 (producers write in place).
ALIAS_KINDS = ("view", "inplace", "concat")


#: The key of ``value.meta`` where an op set's inference keeps what it knows of a value beyond its
#: type (ge_opset: the symbolic contents of a shape vector); a change of it is a change of the node.
INFERRED_META = "shape_data"

#: ``infer(node, opset) -> list[TensorType]``: output types from the node's input types (and
#: constant inputs, ``value.const_value``). May return None when it cannot tell.
InferFn = Callable[[Node, int], "Sequence[TensorType | None] | None"]


@dataclass
class OpDef:
    """What the compiler knows of an op type (independent of any backend)."""

    op_type: str
    domain: str = ""
    min_inputs: int = 0
    max_inputs: int = 2**31 - 1
    min_outputs: int = 1
    max_outputs: int = 1
    kind: OpKind = OpKind.OPAQUE
    infer: InferFn | None = None
    #: Opset versions in which the op exists: (first, last); ``None`` for no upper bound.
    since_version: int = 1
    deprecated_after: int | None = None
    #: False for ops whose result varies between runs (RandomNormal...): never merged or folded.
    deterministic: bool = True
    #: Attributes with their default values (documentation, and the printer).
    attrs: dict[str, Any] = field(default_factory=dict)
    doc: str = ""
    #: ``check(node)``: validates the node's attributes before a backend sees them (run by
    #: :meth:`OpRegistry.check_node`, so by ``load_om``'s verification); raises a GEError (a
    #: :class:`GraphError`) naming the node. For ops whose attributes steer generated code.
    check: Callable[[Node], None] | None = None
    #: True for ops only the compiler makes (fused kernels): their domain is refused in a source
    #: model (:meth:`OpRegistry.internal_domains`); an .om may hold them, checked by ``check``.
    internal: bool = False
    #: Aliasing fact (one of :data:`ALIAS_KINDS`); ``None``: "inplace" for the ELEMWISE and
    #: BROADCAST kinds, else none; ``""``: the output never shares an input's bytes.
    alias: str | None = None
    #: The op set's structural copy (output 0 is input 0): the op :class:`ge_core.ir.Graph`
    #: routes a repeated or outer graph output through (:func:`ge_core.ir.graph.declare_copy_op`).
    copy: bool = False
    #: ``lower(node, opset) -> values``: the node as standard ONNX nodes (inserted before it; the
    #: values replace its outputs), ``opset`` the graph's default one: ``ge export``'s form of it
    lower: Callable[[Node, int], Sequence[Any]] | None = None

    def __post_init__(self) -> None:
        if self.alias not in (None, "", *ALIAS_KINDS):
            raise PluginError(f"op {self.op_type}: alias must be one of {', '.join(ALIAS_KINDS)}, not {self.alias!r}")

    @property
    def aliasing(self) -> str:
        """The aliasing fact the memory problem uses ("" for none)."""
        if self.alias is not None:
            return self.alias
        return "inplace" if self.kind in (OpKind.ELEMWISE, OpKind.BROADCAST) else ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)


class OpRegistry(Registry[OpDef]):
    """Op definitions keyed by ``(domain, op_type)``; ``"ai.onnx"`` is the same as ``""``."""

    def __init__(self) -> None:
        super().__init__("op")

    def add(self, key: Any, obj: OpDef, plugin: str) -> None:
        super().add(key, obj, plugin)
        if obj.copy:
            declare_copy_op(obj.op_type, obj.domain)

    @staticmethod
    def norm_domain(domain: str) -> str:
        return "" if domain in ("", "ai.onnx") else domain

    def lookup(self, domain: str, op_type: str) -> OpDef | None:
        return self.get((self.norm_domain(domain), op_type))

    def check_node(self, node: Node) -> OpDef:
        """The node's OpDef; raises UnsupportedOpError (op, domain, node) or GraphError on arity."""
        d = self.lookup(node.domain, node.op_type)
        if d is None:
            raise unknown_ops_error([node], self)
        n_in = len(node.inputs)
        if not (d.min_inputs <= n_in <= d.max_inputs):
            raise UnsupportedOpError(
                f"{node.describe()} has {n_in} inputs; {d.op_type} takes {d.min_inputs}..{d.max_inputs}"
            )
        if d.check is not None:
            try:
                d.check(node)
            except GEError:
                raise
            except BaseException as e:  # noqa: BLE001 - a plugin's check: name the node
                reraise_interrupt(e)
                raise GraphError(f"{node.describe()}: invalid attributes: {type(e).__name__}: {e}") from None
        return d

    def internal_domains(self) -> set[str]:
        """Domains of ops only the compiler makes (``OpDef.internal``): never in a source model."""
        return {d.domain for d in self.values() if d.internal and self.norm_domain(d.domain)}

    def infer_node(self, node: Node, opset_imports: dict[str, int]) -> bool:
        """Infer and set output types of one node; True if any output type changed (or what the
        inference keeps in an output's ``meta[INFERRED_META]``: the op set's symbolic shape data)."""
        d = self.lookup(node.domain, node.op_type)
        if d is None or d.infer is None:
            return False
        opset = opset_imports.get(self.norm_domain(node.domain), opset_imports.get(node.domain, 0))
        facts = [v.meta.get(INFERRED_META) for v in node.outputs]
        try:
            types = d.infer(node, opset)
        except GEError:
            raise
        except BaseException as e:  # noqa: BLE001 - inference code of a plugin: name the node
            reraise_interrupt(e)
            raise ShapeInferenceError(f"type/shape inference failed at {node.describe()}: {e}") from e
        changed = facts != [v.meta.get(INFERRED_META) for v in node.outputs]
        if not types:
            return changed
        for v, t in zip(node.outputs, types):
            if t is None:
                continue
            new = _merge(v.type, t)
            if new != v.type:
                v.type = new
                changed = True
        return changed


def _merge(old: TensorType, new: TensorType) -> TensorType:
    """Keep what is known: an inferred unknown never erases a known dtype or dim."""
    dtype = new.dtype if new.dtype is not None else old.dtype
    if new.shape is None:
        shape = old.shape
    elif old.shape is None or len(old.shape) != len(new.shape):
        shape = new.shape
    else:
        shape = tuple(n if n is not None else o for o, n in zip(old.shape, new.shape))
    return TensorType(dtype, shape)


def unknown_ops_error(nodes: Sequence[Node], registry: OpRegistry | None = None, source: str = "") -> UnsupportedOpError:
    """One error listing every unknown (domain, op) with up to three node names each."""
    by_op: dict[tuple[str, str], list[str]] = {}
    for n in nodes:
        by_op.setdefault((n.domain, n.op_type), []).append(n.name)
    parts = []
    for (dom, op), names in sorted(by_op.items()):
        shown = ", ".join(f"'{x}'" for x in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        hint = ""
        if registry is not None:
            hint = close_matches(op, {k[1] for k in registry.keys()})
        parts.append(f"op '{op}' in domain '{dom or 'ai.onnx'}' at node {shown}{hint}")
    where = f" in {source}" if source else ""
    return UnsupportedOpError(f"no plugin provides {len(by_op)} op type(s){where}: " + "; ".join(parts),
                              hint="install or write a plugin that registers these ops (ge_register_ops) and "
                                   "their kernels")


def infer_graph(graph: Graph, registry: OpRegistry) -> int:
    """Infer types of every node in order (subgraphs too); returns how many outputs changed."""
    changed = 0
    for node in graph.nodes:
        changed += sum(infer_graph(sub, registry) for sub in node.subgraphs())
        if registry.infer_node(node, graph.opset_imports):
            changed += 1
    return changed
