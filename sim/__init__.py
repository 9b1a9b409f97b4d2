"""gpurm sim."""
