"""Test session set-up: 8 fake CPU devices so sharded code is exercised on any machine.

A persistent compilation cache shared by this session's processes lets the subprocess tests
(resume after SIGKILL, multi-process runs) reuse programs compiled earlier instead of recompiling.
"""
import os
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                      tempfile.mkdtemp(prefix="bindjax-test-jit-cache-"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
