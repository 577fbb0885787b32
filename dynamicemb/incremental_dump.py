"""Incremental dump of dynamic embedding tables.

This module is to hold ``incremental_dump`` (the keys, embeddings, optimizer
states and scores changed since a score threshold, gathered per embedding
collection), and ``get_score`` / ``set_score`` (the score a table uses in its
next forward pass, as the reference point of the next dump). They are not
implemented yet; nothing is exported.
"""

__all__ = []
