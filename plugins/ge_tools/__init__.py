"""ge_tools: the model user's tools: ``ge bench``, ``ge compare`` and ``ge export``."""
