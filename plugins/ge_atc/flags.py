"""Every ATC flag this front door knows, with what it does here.

One table serves ``atc --help`` (implemented flags first, then the accepted-but-ignored ones
grouped by why), the note an ignored flag prints (once per run) and ``docs/atc.md``. A flag of
ATC's that is in none of these lists is refused as unknown, with close matches.
"""

from __future__ import annotations

#: Flags that do what ATC documents (``name: help``), in the order ``atc --help`` shows them.
IMPLEMENTED: dict[str, str] = {
    "mode": "0: compile to .om (default); 1: .om to JSON; 3: pre-check only (--check_report); "
            "6: display .om info",
    "model": "source model file (.onnx, .pb, SavedModel folder, Keras file)",
    "framework": "0 Caffe (refused: no Caffe frontend), 1 MindSpore, 3 TensorFlow, 5 ONNX",
    "output": "output path; .om is appended when missing",
    "om": "with --mode=1/6: the .om to read",
    "json": "with --mode=1: write the JSON here instead of printing it",
    "check_report": "with --mode=3: where the pre-check report goes (default check_result.json)",
    "soc_version": "the backend (cpu); Ascend names are accepted and run on the default backend",
    "input_shape": "\"name:n,c,h,w;name2:...\" (-1 keeps a dim dynamic; lo~hi a range, e.g. x:1~8,3,224,224)",
    "input_shape_range": "GE's older range syntax \"name:[1~8,3,224,224];name2:[...]\" (the same as ranges in "
                         "--input_shape; not with it)",
    "dynamic_batch_size": "\"1,2,4,8\": batch gears for the -1 batch dims of --input_shape; one static model "
                          "per gear in one .om, a run takes the gear of its feed",
    "dynamic_image_size": "\"224,224;320,320\": height,width gears for the -1 H and W of a 4-D --input_shape",
    "dynamic_dims": "\"1,16;2,32\": gears giving every -1 dim of --input_shape a value, in order across inputs",
    "input_format": "NCHW or NHWC: the layout of the model's image input (with --insert_op_conf "
                    "AIPP it says how the model's input is laid out)",
    "out_nodes": "\"node:index;...\" or tensor names: the outputs to keep",
    "output_type": "FP32/FP16/UINT8/... for every output, or \"node:index:FP16;...\" per output",
    "precision_mode": "force_fp32, force_fp16, allow_fp32_to_fp16, must_keep_origin_dtype, "
                      "allow_mix_precision(_fp16|_bf16), allow_fp32_to_bf16, cube_fp16in_fp32out",
    "keep_dtype": "file: one node name or OpType::TypeName per line kept at its original precision",
    "modify_mixlist": "JSON file editing the black/gray/white lists of mixed precision",
    "insert_op_conf": "AIPP config file (static AIPP: crop, csc, channel swap, mean/min/var, padding)",
    "external_weight": "0: weights inside the .om; 1: one file per weight beside it; 2: one merged file",
    "oo_level": "O0..O3: optimisation level (O3 is ATC's default; this engine's default is O2)",
    "oo_constant_folding": "true/false: constant folding",
    "oo_dead_code_elimination": "true/false: If nodes with a constant condition become their branch",
    "optimization_switch": "\"pass:on;pass:off\": switch passes by this engine's or GE's name",
    "deterministic": "0/1: 1 runs GE's own thread pool, whose results have the same bits at any thread count",
    "fusion_switch_file": "GE's JSON fusion switch file",
    "compression_optimize_conf": "GE's compression config: its calibration block quantises the model to int8 (ge_quant)",
    "memory_optimize_level": "off/normal/high (or 0/1/2)",
    "enable_single_stream": "true/false",
    "disable_reuse_memory": "0/1",
    "constant_folding": "true/false (this engine's spelling of --oo_constant_folding)",
    "display_model_info": "0/1: with --mode=0, print the --mode=6 summary of the new .om",
    "log": "debug, info, warning, error, null",
    "config": "pipeline config (TOML), an extension of this engine",
    "report": "write the compile report (JSON), an extension of this engine",
}

#: Accepted and ignored, grouped by why: ``group: {flag: note}``.
IGNORED: dict[str, dict[str, str]] = {
    "NPU-only (Ascend hardware, AI Core, TBE/AOE tooling)": {
        "op_select_implmode": "selects high-precision/high-performance TBE kernels; the cpu kernels have one implementation",
        "optypelist_for_implmode": "goes with --op_select_implmode",
        "op_precision_mode": "TBE kernel precision ini file",
        "enable_small_channel": "an AI Core layout (C0=4) optimisation",
        "enable_compress_weight": "NPU weight compression",
        "compress_weight_conf": "goes with --enable_compress_weight",
        "buffer_optimize": "L1/L2 buffer fusion of the AI Core",
        "input_fp16_nodes": "feeds float16 NC1HWC0 tensors, the NPU's layout",
        "is_input_adjust_hw_layout": "NC1HWC0 inputs, the NPU's layout",
        "is_output_adjust_hw_layout": "NC1HWC0 outputs, the NPU's layout",
        "core_type": "AiCore or VectorCore",
        "aicore_num": "number of AI Cores",
        "virtual_type": "Ascend virtualisation",
        "op_debug_level": "TBE compiler debug output",
        "debug_dir": "TBE compiler intermediate files",
        "op_compiler_cache_mode": "TBE kernel compile cache",
        "op_compiler_cache_dir": "TBE kernel compile cache",
        "auto_tune_mode": "AOE/Auto Tune for TBE kernels",
        "op_bank_path": "Auto Tune's repository",
        "mdl_bank_path": "model tuning repository",
        "sparsity": "structured sparsity of the AI Core",
        "allow_hf32": "the NPU's HF32 matrix mode",
        "status_check": "NPU overflow status checks",
        "host_env_os": "cross-compiling for an NPU host",
        "host_env_cpu": "cross-compiling for an NPU host",
        "distributed_cluster_build": "multi-device NPU builds",
        "device_id": "NPU device id",
        "target": "NPU target (mini/lite)",
        "shape_generalized_build_mode": "TBE shape generalisation",
    },
    "Caffe-only (no Caffe frontend here)": {
        "weight": "the .caffemodel of a Caffe model",
        "op_name_map": "maps Caffe custom op names",
        "enable_scope_fusion_passes": "TensorFlow/Caffe parser scope fusions of GE's parser",
    },
    "not needed here (this engine does it anyway, or it changes nothing on cpu)": {
        "dump_mode": "--mode=1 writes shapes in its JSON always",
        "save_original_model": "the source model is never changed",
    },
}

#: ATC flags refused with a reason (accepting them would silently build a different model).
REFUSED: dict[str, str] = {
    "singleop": "single-op models from a JSON op list are not built",
    "cal_conf": "calibration (quantisation) configs are not supported",
}


def ignored_note(flag: str) -> str | None:
    """The note for an accepted-but-ignored flag, or None."""
    for group, flags in IGNORED.items():
        if flag in flags:
            return f"--{flag} has no effect on this engine ({group.split(' (')[0]}: {flags[flag]})"
    return None


def all_ignored() -> list[str]:
    return [f for flags in IGNORED.values() for f in flags]
