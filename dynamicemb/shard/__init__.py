"""TorchRec sharders for dynamic embedding tables.

This package is to hold ``DynamicEmbeddingCollectionSharder`` (a TorchRec
``EmbeddingCollectionSharder`` whose index deduplication and input
distribution suit hash-table-backed tables) and its EmbeddingBagCollection
counterpart. They are not implemented yet; nothing is exported.
"""

__all__ = []
