"""ge_quant: quantised models as int8 regions (the ``qdq_regions`` pass), the compile report's
``int8`` section, and a calibrating quantiser in AMCT's place (``ge.quantize``, ATC's
``--compression_optimize_conf``)."""
