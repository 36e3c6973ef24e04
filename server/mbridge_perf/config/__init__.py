"""TrainingConfig, its readers, presets and the GPU catalog."""
