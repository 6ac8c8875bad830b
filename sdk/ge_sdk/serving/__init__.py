"""Serving helpers for compiled models: the dynamic batcher and Prometheus metrics used by `ge serve`."""
