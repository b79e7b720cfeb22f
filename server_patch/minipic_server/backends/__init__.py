"""Attention backends that keep keys block-relative in the cache and honour span windows."""
