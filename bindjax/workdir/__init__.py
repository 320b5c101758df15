"""A sweep's workdir: lock, checks, result rows and schema, writer, checkpoints and their
checksums."""
