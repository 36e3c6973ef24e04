"""Per-GPU memory estimation: parameter counts, model state, activations, pipeline stages."""
