"""The rewrite driver's re-inference (``Rewriter.reinfer``): a rewrite that makes a node with
complete inputs inconsistent raises the ShapeInferenceError naming that node instead of leaving
its stale type behind; with incomplete inputs an inference failure still only waits."""

import numpy as np
import pytest

from ge_core.errors import ShapeInferenceError
from ge_core.plugins import get_host
from ge_sdk import GraphBuilder
from ge_sdk.rewrite import OpRule, rewrite


def _graph(batch):
    """x[batch, 3] -> Relu 'r' -> MatMul with w[3, 4]."""
    b = GraphBuilder()
    x = b.input("x", "float32", (batch, 3))
    r = b.Relu(x)
    b.output(b.MatMul(r, b.const(np.ones((3, 4), np.float32))))
    return b.build()


def _swap_in_transpose(node, rw):
    """Replace the Relu's output by Transpose(x): the MatMul reading it now gets [3, batch]."""
    t = rw.add_node("Transpose", [node.inputs[0]], {"perm": [1, 0]}, before=node)
    return rw.replace_value(node.outputs[0], t.outputs[0])


def test_an_inconsistent_node_with_complete_inputs_is_named():
    g = _graph(2)
    with pytest.raises(ShapeInferenceError) as e:
        rewrite(g, [OpRule("Relu", _swap_in_transpose)], ops=get_host().registries.ops)
    assert "(MatMul)" in str(e.value) and "float32[3,2]" in str(e.value)  # names the node and what it got


def test_incomplete_inputs_only_wait():
    g = _graph(None)  # an unknown batch: [?, 3] -> [3, ?] @ [3, 4] cannot be told yet
    res = rewrite(g, [OpRule("Relu", _swap_in_transpose)], ops=get_host().registries.ops)
    mm = next(n for n in g.node_list() if n.op_type == "MatMul")
    assert res.changed and mm.inputs[0].producer.op_type == "Transpose"
