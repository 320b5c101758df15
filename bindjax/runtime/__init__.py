"""Running on devices: mesh and sharding, the vmapped replica engine, XLA."""
