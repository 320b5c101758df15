"""Basics every layer uses: files and JSON, errors, config values, progress."""
