"""Frozen embedding sets: storage, extraction, original-code files, probes, geometry."""
