"""Attention backends that read unrotated keys and honour span windows."""
