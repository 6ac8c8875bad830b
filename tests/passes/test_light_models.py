"""The default pipeline on the nine light models: what must be gone, and the outputs still match
onnxruntime running the original model."""

import numpy as np
import onnxruntime as ort
import pytest

import ge_core as ge
from tests.conftest import LIGHT_MODELS, assert_light_outputs_match, light_model_path
from tests.passes.harness import ATOL, RTOL, assert_same_outputs, op_counts, optimize

ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Pow", "Neg", "Sqrt", "Reciprocal", "Sum", "Max", "Min", "Mean",
              "Unsqueeze", "Squeeze", "Reshape", "Cast", "Concat", "Gather", "Shape", "Expand", "Transpose"}


def _ort(path, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_default_pipeline_cleans_light_model_and_matches_onnxruntime(name):
    path = light_model_path(name)
    original = ge.load(path)
    g = optimize(original)
    counts = op_counts(g)
    for op in ("ConstantOfShape", "Identity", "Dropout", "Constant"):
        assert op not in counts, f"{name}: {counts}"
    for n in g.nodes:
        if n.op_type in ARITHMETIC:
            assert not all(v is None or v.is_constant for v in n.inputs), f"{name}: {n.describe()} is constant-fed"
    assert len(g) < len(original)
    # the whole default compile, against onnxruntime on the original file
    model = ge.compile(path)
    assert model.report["nodes_after"] <= len(g)
    rng = np.random.default_rng(3)
    feeds = {v.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in v.type.shape]).astype(np.float32)
             for v in original.inputs}
    want = _ort(path, feeds)
    got = model.run(feeds)
    assert list(got) == list(want)
    assert_light_outputs_match(name, path, feeds, got, list(want.values()), rtol=RTOL, atol=ATOL)


# Each pass alone (after folding, which the light models need before anything else applies) on the
# two light models where every family fires, against the unoptimised graph.
SINGLE = ["fold_shapes", "eliminate_noops", "simplify_algebra", "merge_constant_arithmetic",
          "fold_affine_into_batchnorm", "simplify_layout", "share_constants", "cse", "dce"]


@pytest.mark.parametrize("name", ["squeezenet", "densenet121"])
def test_each_pass_after_folding_keeps_light_model_outputs(name):
    original = ge.load(light_model_path(name))
    folded = optimize(original, ["fold_constants"])
    assert "ConstantOfShape" not in op_counts(folded)
    # one convolution algorithm on both sides: folded weights are constants, which take Winograd,
    # computed ones im2col, and squeezenet's constant light weights give logits of ~1e9 whose
    # softmax turns that rounding into visible differences (the passes are what is compared)
    same = {"conv_algorithm": "im2col"}
    assert_same_outputs(original, folded, seeds=(0,), oracle=False, options=same)
    for p in SINGLE:
        g = optimize(folded, [p])
        assert_same_outputs(folded, g, seeds=(0,), oracle=False, options=same)
