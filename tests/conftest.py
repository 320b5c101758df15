"""Test session set-up: 8 fake CPU devices so sharded code is exercised on any machine, and no
persistent compilation cache for the commands tests run in-process (it is a process-wide JAX
setting, and the user's cache is not the tests' to fill)."""
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["BINDJAX_COMPILATION_CACHE"] = "0"
