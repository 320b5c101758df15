"""Reading finished sweeps: statistics, markdown tables, plots."""
