"""``ge serve``: compiled models over the Open Inference Protocol (KServe v2), on KServe's
ModelServer (the model adapter, batcher and metrics are ``ge_sdk.serving``'s)."""
