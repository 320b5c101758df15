"""Training sweeps: grid, bucket packing, bucket programs, step, sweep loop."""
