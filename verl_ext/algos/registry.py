"""Registrations with verl's advantage-estimator registry (filled in by the foundation work)."""
