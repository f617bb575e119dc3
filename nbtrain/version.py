"""nbtrain's version, in a module of its own: code on any floor records it (the workload digest) without
importing the package above it."""
__version__ = "0.1.0"
