"""An example third-party plugin for GE for Python (see plugin.py)."""

__version__ = "0.1.0"
