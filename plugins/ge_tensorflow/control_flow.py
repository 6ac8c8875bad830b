"""Control flow: ``If``/``StatelessIf`` to ONNX ``If``, ``While``/``StatelessWhile`` to ``Loop``.

Branch and body functions become IR subgraphs that read outer values directly (ONNX's implicit
captures). The TensorList pattern that Keras RNNs and ``tf.TensorArray`` produce inside loops
is converted the way a scan is:

* ``TensorListFromTensor(t)`` passed unchanged through a loop and read with
  ``TensorListGetItem(list, i)`` becomes ``Gather(t, i)`` inside the body;
* ``TensorListReserve`` written once per iteration with ``TensorListSetItem`` becomes a scan
  output of the Loop, and ``TensorListStack`` after the loop is that scan output.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ge_core.ir.graph import Value
from ge_core.ir.types import TensorType

from .convert import as_graph_output
from .mappers import cast_to, i64, mapper


class TensorListIn:
    """A TensorList made from a tensor (read element-wise)."""

    def __init__(self, tensor: Value) -> None:
        self.tensor = tensor


class TensorListOut:
    """An empty TensorList to be filled one element per loop iteration."""

    def __init__(self, name: str) -> None:
        self.name = name


class TensorListWritten:
    """``TensorListOut`` after ``TensorListSetItem(list, index, item)`` in a loop body."""

    def __init__(self, target: TensorListOut, item: Value) -> None:
        self.target, self.item = target, item


class TensorListStacked:
    """A TensorList filled by a loop: its elements stacked in ``value``."""

    def __init__(self, value: Value) -> None:
        self.value = value


_TL = (TensorListIn, TensorListOut, TensorListWritten, TensorListStacked)


@mapper("TensorListFromTensor")
def _tl_from_tensor(ctx):
    return TensorListIn(ctx.input(0))


@mapper("TensorListReserve", "EmptyTensorList")
def _tl_reserve(ctx):
    return TensorListOut(ctx.name)


@mapper("TensorListGetItem")
def _tl_get_item(ctx):
    lst = ctx.raw_input(0)
    if isinstance(lst, TensorListIn):
        t = lst.tensor
    elif isinstance(lst, TensorListStacked):
        t = lst.value
    else:
        ctx.fail("reads a TensorList that was not made from a tensor or filled by a loop")
        raise AssertionError
    return ctx.op("Gather", t, ctx.input(1), axis=0)


@mapper("TensorListSetItem")
def _tl_set_item(ctx):
    lst = ctx.raw_input(0)
    if not isinstance(lst, TensorListOut):
        ctx.fail("writes a TensorList other than an empty reserved one inside a loop (not supported)")
    return TensorListWritten(lst, ctx.input(2))


@mapper("TensorListStack")
def _tl_stack(ctx):
    lst = ctx.raw_input(0)
    if isinstance(lst, TensorListStacked):
        return lst.value
    if isinstance(lst, TensorListIn):
        return lst.tensor
    ctx.fail("stacks a TensorList that no loop filled")
    return None


@mapper("TensorListLength")
def _tl_length(ctx):
    lst = ctx.raw_input(0)
    t = lst.tensor if isinstance(lst, TensorListIn) else lst.value if isinstance(lst, TensorListStacked) else None
    if t is None:
        ctx.fail("needs the length of a TensorList of unknown size")
    shape = ctx.op("Shape", t, start=0, end=1)
    return cast_to(ctx, ctx.op("Squeeze", shape, i64(ctx, [0])), np.int32)


def _shape_list(ctx, attr: str, n: int) -> list:
    import tensorflow as tf

    shapes = ctx.attr(attr) or []
    if len(shapes) == n:
        return [tf.TensorShape(s) if s is not None else tf.TensorShape(None) for s in shapes]
    return [ctx.tf_op.inputs[i].shape for i in range(n)]


# ------------------------------------------------------------------------------------------
# If
# ------------------------------------------------------------------------------------------
@mapper("If", "StatelessIf")
def _if(ctx):
    cond = ctx.input(0)
    ct = ctx.in_type(0)
    if ct.dtype != np.bool_:
        zero = ctx.constant(np.zeros((), dtype=ct.dtype or np.float32))
        cond = ctx.op("Not", ctx.op("Equal", cond, zero))
    if ct.rank:
        cond = ctx.op("Reshape", cond, i64(ctx, []))
    args = [ctx.raw_input(i) for i in range(1, ctx.num_inputs)]
    shapes = [ctx.tf_op.inputs[i].shape for i in range(1, ctx.num_inputs)]
    branches = []
    n_out = ctx.num_outputs
    for key in ("then_branch", "else_branch"):
        fname = ctx.attr(key)
        g, outs, _ = ctx.converter.subgraph(fname, args, shapes, ctx.graph, f"{ctx.name}/{key}", num_outputs=n_out)
        vals = []
        for o in outs:
            if not isinstance(o, Value):
                ctx.fail(f"returns a {type(o).__name__} from its {key} (only tensors are supported)")
            vals.append(as_graph_output(g, o))
        if len(vals) != n_out:
            ctx.fail(f"{key} returns {len(vals)} values for {n_out} outputs")
        g.set_outputs(vals)
        branches.append(g)
    node = ctx.make("If", [cond], {"then_branch": branches[0], "else_branch": branches[1]}, num_outputs=n_out)
    for j, v in enumerate(node.outputs):
        v.type = ctx.out_type(j)
    return list(node.outputs)


# ------------------------------------------------------------------------------------------
# While
# ------------------------------------------------------------------------------------------
@mapper("While", "StatelessWhile")
def _while(ctx):
    n = ctx.num_inputs
    init = [ctx.raw_input(i) for i in range(n)]
    shapes = _shape_list(ctx, "output_shapes", n)
    conv = ctx.converter
    cond_name, body_name = ctx.attr("cond"), ctx.attr("body")

    # classify loop variables
    carried: list[int] = []
    outs_lists: dict[int, TensorListOut] = {}
    for i, v in enumerate(init):
        if isinstance(v, Value):
            carried.append(i)
        elif isinstance(v, TensorListOut):
            outs_lists[i] = TensorListOut(f"{ctx.name}/list{i}")
        elif isinstance(v, TensorListIn):
            pass
        else:
            ctx.fail(f"carries a {type(v).__name__} through the loop (input {i}), which is not supported")

    # the first condition, in the outer graph
    cond0 = conv.inline_function(cond_name, init, shapes, ctx.graph, num_outputs=1)[0]
    if not isinstance(cond0, Value):
        ctx.fail("has a condition that is not a tensor")
    cond0 = _to_bool_scalar(ctx, cond0)

    # the body
    from ge_core.ir.graph import Graph

    body = Graph(f"{ctx.name}/body", parent=ctx.graph)
    body.add_input(body.names.fresh(f"{ctx.name}/iter"), TensorType(np.int64, ()))
    body.add_input(body.names.fresh(f"{ctx.name}/cond_in"), TensorType(np.bool_, ()))
    args: list[Any] = []
    for i, v in enumerate(init):
        if i in carried:
            t = ctx.in_type(i)
            sh = shapes[i]
            shape = tuple(sh.as_list()) if sh.rank is not None else None
            args.append(body.add_input(body.names.fresh(f"{ctx.name}/var{i}"), TensorType(t.dtype, shape)))
        elif i in outs_lists:
            args.append(outs_lists[i])
        else:
            args.append(v)
    outs = conv.inline_function(body_name, args, shapes, body, num_outputs=n)
    if len(outs) != n:
        ctx.fail(f"has a body returning {len(outs)} values for {n} loop variables")
    scans: list[tuple[int, Value]] = []
    for i, o in enumerate(outs):
        if i in carried:
            if not isinstance(o, Value):
                ctx.fail(f"turns loop variable {i} into a {type(o).__name__}")
        elif i in outs_lists:
            if not isinstance(o, TensorListWritten) or o.target is not outs_lists[i]:
                ctx.fail(f"does not write TensorList loop variable {i} exactly once per iteration")
            scans.append((i, o.item))
        elif o is not init[i]:
            ctx.fail(f"changes the TensorList loop variable {i} it reads")
    cond_next = conv.inline_function(cond_name, outs, shapes, body, num_outputs=1)[0]
    if not isinstance(cond_next, Value):
        ctx.fail("has a condition that is not a tensor")
    cond_next = _to_bool_scalar_in(body, cond_next, ctx)
    body_outs = [as_graph_output(body, cond_next)]
    body_outs += [as_graph_output(body, outs[i]) for i in carried]
    body_outs += [as_graph_output(body, item) for _, item in scans]
    body.set_outputs(body_outs)

    loop_inputs: list[Value | None] = [None, cond0] + [init[i] for i in carried]
    node = ctx.make("Loop", loop_inputs, {"body": body}, num_outputs=len(carried) + len(scans))
    result: list[Any] = list(init)
    for k, i in enumerate(carried):
        v = node.outputs[k]
        v.type = ctx.out_type(i)
        result[i] = v
    for k, (i, item) in enumerate(scans):
        v = node.outputs[len(carried) + k]
        it = item.type
        v.type = TensorType(it.dtype, (None,) + tuple(it.shape) if it.shape is not None else None)
        result[i] = TensorListStacked(v)
    return result


def _to_bool_scalar(ctx, v: Value) -> Value:
    return _to_bool_scalar_in(ctx.graph, v, ctx)


def _to_bool_scalar_in(graph, v: Value, ctx) -> Value:
    t = v.type
    if t.dtype is not None and t.dtype != np.bool_:
        v = graph.add_node("Cast", [v], {"to": 9}, name=f"{ctx.name}/cond_cast").output
    if t.rank:
        shape = graph.add_constant(np.zeros((0,), dtype=np.int64), graph.names.fresh(f"{ctx.name}/scalar"))
        v = graph.add_node("Reshape", [v, shape], name=f"{ctx.name}/cond_scalar").output
    return v
