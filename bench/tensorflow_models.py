"""Latency of this engine against TensorFlow's own on the Keras applications, in one run.

    python bench/tensorflow_models.py [--size 96] [--repeat 20] [--models MobileNetV2,ResNet50]

Each model is built with ``weights=None`` (fixed seed), frozen to a GraphDef and compiled with
``ge.compile(path, {"framework": 3})``. The runs of both engines are interleaved (one GE run,
one TensorFlow run, ...) so that machine noise hits both alike; the table gives medians, the
speed-up (TF / GE) and the largest difference between the two outputs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODELS = {"MobileNetV2": 96, "ResNet50": 96, "InceptionV3": 96, "DenseNet121": 96, "EfficientNetB0": 96}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=None, help="input height/width (default: 96)")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args(argv)

    import keras
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    import ge_core as ge

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in [m.strip() for m in args.models.split(",") if m.strip()]:
            size = args.size or MODELS.get(name, 96)
            keras.utils.set_random_seed(0)
            model = getattr(keras.applications, name)(weights=None, input_shape=(size, size, 3), classes=1000)
            spec = tf.TensorSpec((args.batch, size, size, 3), tf.float32, name="x")
            tf_fn = tf.function(lambda x, model=model: model(x, training=False), jit_compile=False)
            cf = tf_fn.get_concrete_function(spec)
            frozen = convert_variables_to_constants_v2(cf)
            tf.io.write_graph(frozen.graph.as_graph_def(), tmp, f"{name}.pb", as_text=False)
            t0 = time.perf_counter()
            compiled = ge.compile(os.path.join(tmp, f"{name}.pb"), {"framework": 3})
            compile_s = time.perf_counter() - t0
            x = np.random.default_rng(0).uniform(-1, 1, (args.batch, size, size, 3)).astype(np.float32)
            feeds = {compiled.input_names[0]: x}
            xt = tf.constant(x)
            for _ in range(args.warmup):
                compiled.run(feeds)
                cf(xt)
            ge_t, tf_t = [], []
            for _ in range(args.repeat):
                t = time.perf_counter()
                (y,) = compiled.run(feeds).values()
                ge_t.append(time.perf_counter() - t)
                t = time.perf_counter()
                ref = cf(xt)
                ref = (ref[0] if isinstance(ref, (list, tuple)) else ref).numpy()
                tf_t.append(time.perf_counter() - t)
            g, f = statistics.median(ge_t) * 1e3, statistics.median(tf_t) * 1e3
            rows.append((name, size, g, f, f / g, float(np.abs(y - ref).max()), compile_s,
                         compiled.report["op_counts"].get("Transpose", 0)))
            print(f"{name:16s} done", file=sys.stderr)
    print(f"{'model':16s} {'input':>7s} {'GE ms':>9s} {'TF ms':>9s} {'TF/GE':>7s} {'max|diff|':>10s} {'compile s':>9s} {'transposes':>10s}")
    for name, size, g, f, sp, diff, cs, tr in rows:
        print(f"{name:16s} {size:>4d}px {g:9.2f} {f:9.2f} {sp:7.2f} {diff:10.2e} {cs:9.2f} {tr:10d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
