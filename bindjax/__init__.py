"""bindjax: how embedding models bind concepts, in JAX/Flax."""

__version__ = "0.1.0"
