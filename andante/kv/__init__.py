"""Paged KV-cache bookkeeping: a device tier and a host tier of fixed-size blocks, with
automatic prefix caching on the device tier."""

from andante.kv.block_manager import KVBlockManager
from andante.kv.block_pool import BlockPool, OutOfBlocksError
from andante.kv.prefix_cache import PrefixCache, RequestHashes

__all__ = ["BlockPool", "KVBlockManager", "OutOfBlocksError", "PrefixCache", "RequestHashes"]
