"""bindjax: how embedding models bind concepts, in JAX/Flax."""
import jax

# Sharding must never change the random numbers a replica sees.
jax.config.update("jax_threefry_partitionable", True)

__version__ = "0.1.0"
