"""ge_llm: decoder LLMs. The contrib ops of the transformer and LLM ecosystem (domain
``com.microsoft``, as onnxruntime defines them: norms, activations, rotary, attention with a KV
cache, MatMulNBits), weight-only quantisation, and a generation loop (``ge generate``). Their
kernels are the cpu backend's (``ge_cpu.contrib``)."""
