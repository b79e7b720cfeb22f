"""Attention backends that move reused spans' keys into place and honour span windows."""
