"""Helpers for plugin authors (grows with the SDK issue): build graphs in tests, register a plugin
for one test."""

from .testing import GraphBuilder, temporary_plugin

__all__ = ["GraphBuilder", "temporary_plugin"]
