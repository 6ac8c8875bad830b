"""ge_onnx: the ONNX frontend, the IR -> ONNX exporter and the ``onnx.backend`` adapter.

``ge_onnx.backend`` implements :class:`onnx.backend.base.Backend` so that ONNX's own backend
test suite runs against GE. ONNX is imported lazily.
"""

__all__ = ["plugin", "frontend", "exporter", "backend"]
