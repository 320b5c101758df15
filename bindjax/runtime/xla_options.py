"""XLA compiler options of bindjax's training programs (single runs and sweep buckets).

Two settings, passed per compile (`compiler_options(platform, fast_compile)`), so nothing global
changes:

- CPU: XLA:CPU's YNNPACK library fusions are turned off. They take this project's small dots,
  batched dots and reductions (layer norms, softmax), where XLA's own kernels were faster on a
  2-core EPYC VM (`--xla_defaults` runs of train_step.py and sweep_throughput.py, kept in the git
  history of experiments/benchmarks/results/): the
  small-model sweep 2020–2550 vs 1660 replica-steps/s, the cpu preset's model 1.5× in an
  interleaved run, the published model's single step 3.1 vs 3.6 s; a single small run was the
  same within noise. An explicit --xla_cpu_experimental_ynn_fusion_type in XLA_FLAGS wins.
  `bindjax.complexity` fits keep XLA's defaults: their larger matmuls ran faster with YNNPACK
  (9 MLP-1024 approximators on D=512, 30 steps: 4.8 vs 5.8 s; product and sum+product equal).
- fast_compile: several times cheaper CPU compiles of slightly slower code, for tiny models
  (tests, smoke runs) where compiling dominates the run time. CPU only: on GPU and TPU no
  option is passed. It includes XLA:CPU's older fusion code generator (fusion emitters off),
  which compiles tiny programs faster: the test suite's 12-replica tiny sweep compiled its
  bucket in 13.1 s against 19.2 s, and tests/test_train*.py with test_sweep.py ran in 278 s
  against 332 s (2 busy cores). It is not in the default options because at the `cpu`
  preset's width it compiled slower (18.7 against 13.5 s for one train step) at the same step
  rate (experiments/benchmarks/train_step.py with XLA_FLAGS=--xla_cpu_use_fusion_emitters=false).
"""
import os

YNN_FLAG = "xla_cpu_experimental_ynn_fusion_type"
CPU_OPTIONS = {YNN_FLAG: ""}   # the empty list of library fusion types: none
FAST_COMPILE_OPTIONS = {"xla_backend_optimization_level": 0,
                        "xla_llvm_disable_expensive_passes": True,
                        "xla_cpu_use_fusion_emitters": False}


def compiler_options(platform, fast_compile=False, environ=None):
  """Options for `.compile(...)` of a program for `platform` ("cpu", "gpu", "tpu"), or None."""
  environ = os.environ if environ is None else environ
  options = {}
  if platform == "cpu" and YNN_FLAG not in environ.get("XLA_FLAGS", ""):
    options.update(CPU_OPTIONS)
  if fast_compile and platform == "cpu":  # LLVM CPU back-end options
    options.update(FAST_COMPILE_OPTIONS)
  return options or None
