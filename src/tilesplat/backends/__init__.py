"""Backends: the registry and the implementations (torch reference, cpu, cuda)."""
