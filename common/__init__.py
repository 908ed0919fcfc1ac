"""Torch-free helpers shared by every stage: settings, recipes and artifact manifests."""
