"""Embedding compute over the native ops: initializers for now."""

from dynamicemb.embedding.initializer import init_rows

__all__ = ["init_rows"]
