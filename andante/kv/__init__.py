"""Paged KV-cache bookkeeping: a device tier and a host tier of fixed-size blocks."""

from andante.kv.block_manager import KVBlockManager
from andante.kv.block_pool import BlockPool, OutOfBlocksError

__all__ = ["BlockPool", "KVBlockManager", "OutOfBlocksError"]
