"""Advice on the user's config: the recompute / memory ladder and OOM triage (pure)."""
