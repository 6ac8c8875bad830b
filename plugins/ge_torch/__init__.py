"""ge_torch: PyTorch to GE.

* a frontend (``framework="torch"``) that reads an ``nn.Module`` with example inputs, a
  ``torch.export.ExportedProgram`` or a saved ``.pt2`` program, exports it with
  :func:`torch.export.export`, lowers it to core ATen and maps every ATen op to IR ops with ONNX
  semantics through the op-mapper registry (``ge_register_op_mappers``, framework ``"torch"``);
* a ``torch.compile`` backend named ``"ge"`` (:mod:`ge_torch.dynamo`), registered through
  torch's own ``torch_dynamo_backends`` entry-point group.

Importing this package (or its plugin module) does not import torch.
"""
