"""The transformers' linear layers alone: chains of MatMuls of their shapes, this engine vs
onnxruntime vs OpenVINO, at the same thread count, side by side.

A whole model's latency mixes the GEMMs with attention, norms and the executor; this bench
isolates the GEMMs as a model runs them: each chain is ``layers`` pairs of ``x @ W1`` (hidden ->
ffn) and ``@ W2`` (ffn -> hidden), every weight its own random matrix (scaled by 1/sqrt(k), so
values stay normal), so that the weights come from memory as in a model (a loop over one weight
would find it in the cache), and each product reads the activation the previous one wrote.

    shapes: rows x hidden x ffn, as BERT/GPT-2 (128 x 768 x 3072), ViT-small (197 x 384 x 1536),
            DeiT-tiny (197 x 192 x 768), Whisper-tiny (150 x 384 x 1536), a decoder's single
            step (8 x 768 x 3072) and a long sequence (1024 x 256 x 1024)

Timing, interleaving, idle gaps and the tables are transformer_models.py's (medians, ratios to
onnxruntime, geomeans, speedup from the first to the second thread count); the GFLOP/s of each
engine's median follow the tables.

    python bench/gemm_chain.py [--threads 1,2] [--rounds 7] [--gap 0.3]

Time it with ``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE`` unset in that command. Needs the
``bench`` extra (openvino).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformer_models as tm  # noqa: E402 - the bench folder's engines, timing and tables

#: name -> (rows, hidden, ffn, layers)
CHAINS = {
    "bert_fc": (128, 768, 3072, 3),
    "vit_s_fc": (197, 384, 1536, 6),
    "deit_t_fc": (197, 192, 768, 12),
    "whisper_fc": (150, 384, 1536, 6),
    "decode_fc": (8, 768, 3072, 3),
    "long_fc": (1024, 256, 1024, 4),
}


def chain_model(rows: int, hidden: int, ffn: int, layers: int, seed: int = 0) -> tuple[bytes, dict]:
    """The ONNX chain (``layers`` MatMul pairs, each weight its own) and its feeds."""
    rng = np.random.default_rng(seed)
    nodes, inits, cur = [], [], "x"
    for li in range(layers):
        for j, (k, n) in enumerate(((hidden, ffn), (ffn, hidden))):
            w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{li}_{j}"))
            nodes.append(helper.make_node("MatMul", [cur, f"w{li}_{j}"], [f"h{li}_{j}"]))
            cur = f"h{li}_{j}"
    graph = helper.make_graph(nodes, "gemm_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, hidden])],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, [rows, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString(), {"x": rng.standard_normal((rows, hidden)).astype(np.float32)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before each timed block")
    a = ap.parse_args(argv)
    from threadpoolctl import threadpool_info

    print("BLAS:", [(i["internal_api"], i.get("architecture"), i["num_threads"]) for i in threadpool_info()
                    if i.get("user_api") == "blas"])
    print("OPENBLAS_CORETYPE:", os.environ.get("OPENBLAS_CORETYPE", "unset"))
    models = {name: chain_model(*shape) for name, shape in CHAINS.items()}
    thread_counts = [int(t) for t in a.threads.split(",") if t.strip()]
    results = tm.run_table(models, thread_counts, a.rounds, a.gap, family_of={n: "gemm" for n in models})
    print("\nGFLOP/s of each engine's median")
    for threads, per_model in results.items():
        for name, med in per_model.items():
            rows, hidden, ffn, layers = CHAINS[name]
            flops = 2.0 * rows * hidden * ffn * 2 * layers
            print(f"  threads={threads} {name:11s} "
                  + "  ".join(f"{k} {flops / (ms * 1e-3) / 1e9:.0f}" for k, ms in med.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
