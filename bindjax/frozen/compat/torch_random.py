"""PyTorch-compatible random permutations, for splits that match the original code's."""
import numpy as np

# Above this n PyTorch's CPU randperm switches to 64-bit draws, which this module does not mimic.
_MAX_N = (2**32 - 1) // 20


def randperm(n, seed):
  """The permutation `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` returns.

  PyTorch's CPU generator is MT19937 seeded like numpy's legacy seeding (low 32 bits of the
  seed); randperm swaps r[i] with r[i + draw() % (n - i)] for i = 0..n-2 on raw 32-bit draws
  (docs/frozen.md#pytorch-randperm). Returns int64 [n].
  """
  if isinstance(n, bool) or int(n) != n or not 0 <= n <= _MAX_N:
    raise ValueError(f"randperm: n must be an integer in [0, {_MAX_N}], got {n!r}")
  if isinstance(seed, bool) or int(seed) != seed:
    raise ValueError(f"randperm: seed must be an integer, got {seed!r}")
  n = int(n)
  bit_generator = np.random.MT19937()
  bit_generator._legacy_seeding(int(seed) & 0xFFFFFFFF)  # pylint: disable=protected-access
  draws = bit_generator.random_raw(max(n - 1, 0)).tolist()
  perm = list(range(n))
  for i, draw in enumerate(draws):
    j = i + draw % (n - i)
    perm[i], perm[j] = perm[j], perm[i]
  return np.asarray(perm, dtype=np.int64)
