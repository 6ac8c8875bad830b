"""The fuzz targets: ONNX frontend, .om loader, pipeline config (TOML), fusion switch JSON,
TensorFlow frontend (frozen GraphDef .pb), generated source (fused programs and names in
compiled and source models: nothing a model holds may run as code), PyTorch ``.pt2`` archives
(never unpickled, no program string run as code) and ``.npy`` feed files.

Each target keeps a handful of small valid seeds and mixes two kinds of mutation:

* byte-level edits of the serialized seed (:func:`fuzz_engine.mutate_bytes`): bit flips,
  interesting varints and integers, deletions, insertions, duplication, truncation, splicing;
* structure-aware edits that keep the outer format valid so the input reaches the deep checks:
  protobuf fields of a ModelProto (dims, data types, raw data, external-data locations, op types,
  attributes, opsets, nesting, functions, huge ConstantOfShape shapes), the JSON model definition
  and weights table of an .om (rewritten with valid checksums), TOML tables and values, JSON
  switch tables, the nodes, attributes, Const tensors and function library of a GraphDef, the
  entries, program JSON, tensor configs and tensor files of a .pt2, the header of an .npy.

This module is the registry (:data:`TARGETS`, read by ``fuzz_engine.get_target``); each target
lives in a file of its own: ``target_onnx``, ``target_om``, ``target_config``, ``target_switch``,
``target_tensorflow``, ``target_codegen``, ``target_pt2``, ``target_feeds``, ``target_selftest``,
``native_targets``, ``cache_targets`` and ``file_change_targets``; what several targets share is
in ``fuzz_common`` (odd values, JSON edits), ``onnx_seeds``, ``tf_graphs``, ``pt2_archives`` and
``codegen_support`` (seed models, .om files read and rewritten, the canary; re-exported here
for the tests that use them).
"""

from __future__ import annotations

from cache_targets import CacheTarget
from codegen_support import Canary, codegen_seed_models, internal_nodes, read_om, with_node, write_om
from file_change_targets import MutatedFilesTarget
from fuzz_engine import Target
from native_targets import NativeTarget
from target_codegen import CodegenTarget
from target_config import ConfigTarget
from target_feeds import FeedsTarget
from target_om import OmTarget
from target_onnx import OnnxTarget
from target_pt2 import Pt2Target
from target_selftest import SelfTestTarget
from target_switch import SwitchTarget
from target_tensorflow import TfTarget

__all__ = ["TARGETS", "Canary", "codegen_seed_models", "internal_nodes", "read_om", "with_node", "write_om"]

TARGETS: dict[str, type[Target]] = {"onnx": OnnxTarget, "om": OmTarget, "config": ConfigTarget, "switch": SwitchTarget,
                                     "tensorflow": TfTarget, "codegen": CodegenTarget, "pt2": Pt2Target,
                                     "feeds": FeedsTarget}
TARGETS["selftest"] = SelfTestTarget  # a deliberately broken reader: the harness can fail
TARGETS["native"] = NativeTarget  # every native kernel entry (issue 42)
TARGETS["cache"] = CacheTarget  # races and damage in the cache folder (issue 42)
TARGETS["mutated_files"] = MutatedFilesTarget  # files changed under a loaded model (issue 42)
