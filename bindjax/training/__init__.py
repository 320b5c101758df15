"""Training sweeps: run settings, grid, bucket packing, bucket programs, step, sweep loop."""
