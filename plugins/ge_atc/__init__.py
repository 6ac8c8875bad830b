"""The ``atc`` command: ATC's flags mapped onto this engine's compile options."""
