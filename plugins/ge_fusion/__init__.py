"""ge_fusion: pattern fusions and automatic fusion by op kind, with generated CPU kernels."""
