"""Read the skill pack (skills/, card.yaml) and lint it against the spec and our schemas."""
