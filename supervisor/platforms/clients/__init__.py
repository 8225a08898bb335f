"""Thin clients for the schedulers the platforms drive (no scheduler logic here)."""
