"""Transparent mode: a read-only FUSE view of a packed store for unmodified programs."""
