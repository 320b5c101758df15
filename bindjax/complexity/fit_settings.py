"""Settings of the binding-approximator fits (docs/complexity.md, "Fitting"): `FitConfig`, the
training and solver settings a batch of fits shares, with each family's defaults, and
`EngineConfig`, how a command's fits are laid out on the devices. `bindjax.complexity.fitting`
runs fits under them.
"""
import dataclasses

from bindjax.complexity import coordinate
from bindjax.complexity import families
from bindjax.frozen.probes import linear
from bindjax.runtime import parallel

SCHEDULES = ("cosine", "constant")
_BOOLS = {"true": True, "false": False}
SOLVERS = ("auto", "coordinate", "adam")
CADENCES = ("end", "original")
# Default weight decay per family (standardised targets), measured on planted structure
# (docs/findings/complexity_stability.md): a product of all K·C slots needs less than one of
# each object's C slots; additive and MLP fits are not regularised by default.
WEIGHT_DECAY = {"mlp": 0.0, "additive": 0.0, "product": 3e-4, "sum_product": 3e-4,
                "per_object_product": 3e-3, "per_object_sum_product": 3e-3}
# Default initialisations per fit (restarts = 0), by family. The product families' landscapes
# have poor minima that restarts escape (docs/complexity.md, "Why single fits failed"); an
# additive fit is a factored linear regression, whose minima are all global; MLP fits, as the
# original's, start once: three starts cost 2.9x and moved no correlation
# (docs/findings/binding_fits.md).
RESTARTS = {"mlp": 1, "additive": 1, "product": 3, "sum_product": 3, "per_object_product": 3,
            "per_object_sum_product": 3}
# The coordinate solver per family (solver_projection="auto", solver_iterations=0). The
# per-object forms step their product tables alone, the rest solved exactly at every step
# (variable projection): 8 starts of 10 such steps recover planted per-object structure as
# often as 30 full Levenberg–Marquardt steps, in a third of the time. The global products need
# 30 projected steps to recover theirs, no cheaper than the full solve, so they keep it; the
# additive fit is linear and either way exact (docs/complexity.md, "The coordinate solver").
SOLVER_PROJECTION = {"mlp": False, "additive": False, "product": False, "sum_product": False,
                     "per_object_product": True, "per_object_sum_product": True}
FULL_ITERATIONS = 30
# Starts per coordinate (solver_starts=0): from 8, the global product stops in a poor minimum in 4
# of 20 planted half splits, from 16 in none (docs/complexity.md, "The coordinate solver").
SOLVER_STARTS = {**dict.fromkeys(families.FAMILIES, 8), "product": 16}
PROJECTED_ITERATIONS = {"mlp": 30, "additive": 30, "product": 30, "sum_product": 30,
                        "per_object_product": 10, "per_object_sum_product": 10}
# The original's learning rate: the complexity grid's default and that of every binding fit.
LEARNING_RATE = 1e-2


@dataclasses.dataclass(frozen=True)
class FitConfig:
  """Static training settings shared by a batch of models."""
  steps: int = 4000
  eval_every: int = 100
  # "constant" is the original code's behaviour (it builds a cosine schedule but never steps it).
  schedule: str = "cosine"
  probe_similarity: str = "dot"
  # "end": evaluate after eval_every, 2·eval_every, …, steps; "original": after 1, 1+eval_every,
  # …, as the original code does (it then trains eval_every − 1 unevaluated steps; we stop).
  eval_cadence: str = "end"
  # Initialisations tried per fit (docs/complexity.md, "Restarts"). 0: the family's value in
  # RESTARTS. 1: the single initialisation from the fit's seed, as the original runs it. R > 1:
  # R candidates train restart_steps steps at the fit's constant learning rate; the best one by
  # `restart_holdout` is trained as usual.
  restarts: int = 0
  restart_steps: int = 0      # 0: half of `steps`
  # 0: candidates train on all the fit's training scenes and the lowest training loss wins.
  # h in (0, 1): they train on the scenes of the first 1 − h of the training objects and the
  # lowest error on the remaining train-only scenes (those holding a held-out object) wins.
  restart_holdout: float = 0.0
  # Fit in units of the training targets (their mean removed, divided by their RMS spread), so
  # that weight_decay means the same on every embedding set. False: raw targets, as the original.
  standardize: bool = True
  # L2 penalty on every table, W and kernel, decayed linearly to 0 by the last step: it picks,
  # among the many wide products that fit the training scenes, a low-rank one, which is what
  # predicts unseen objects (docs/complexity.md, "Why single fits failed"). "auto": the
  # family's value in WEIGHT_DECAY; 0: none, as the original.
  weight_decay: float | str = "auto"
  # "coordinate": the additive and product families at E = D with W = I are solved per
  # embedding coordinate by Levenberg–Marquardt (bindjax.complexity.coordinate; docs/
  # complexity.md, "The coordinate solver"); "adam": gradient training as above; "auto": the
  # coordinate solver where it applies, Adam elsewhere (MLPs, E < D, learned W).
  solver: str = "auto"
  solver_starts: int = 0  # coordinate solver: starts per coordinate (0: SOLVER_STARTS)
  # coordinate solver: Levenberg–Marquardt steps of the kept start; 0: FULL_ITERATIONS, or
  # the family's PROJECTED_ITERATIONS under variable projection.
  solver_iterations: int = 0
  # coordinate solver: steps every start takes before only the cheapest goes on (docs/
  # complexity.md, "The coordinate solver"); 0: every start runs to the end.
  solver_screen: int = 0
  # coordinate solver: step the product tables alone, the intercept and sum tables solved
  # exactly at each step (variable projection; docs/complexity.md, "The coordinate solver").
  # "auto": the family's value in SOLVER_PROJECTION.
  solver_projection: bool | str = "auto"
  # coordinate solver: penalty on ‖θ‖² per coordinate, in units of its mean curvature per value
  # (docs/complexity.md, "The coordinate solver").
  solver_ridge: float = 1e-3
  # Cheaper XLA:CPU compiles of slower code (bindjax.runtime.xla_options), for small fits whose
  # time is mostly compiling (tests, a laptop's first look); as a sweep's `fast_compile`.
  fast_compile: bool = False

  def __post_init__(self):
    # A number typed on the command line into the "auto" field arrives as a string.
    if isinstance(self.weight_decay, str) and self.weight_decay != "auto":
      try:
        object.__setattr__(self, "weight_decay", float(self.weight_decay))
      except ValueError:
        pass  # validate() names it
    # So is a boolean typed into the "auto" field.
    if isinstance(self.solver_projection, str) and self.solver_projection.lower() in _BOOLS:
      object.__setattr__(self, "solver_projection", _BOOLS[self.solver_projection.lower()])

  def validate(self):
    """Returns self; ValueError naming the bad field."""
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule={self.schedule!r}: expected one of {SCHEDULES}")
    if self.eval_cadence not in CADENCES:
      raise ValueError(f"eval_cadence={self.eval_cadence!r}: expected one of {CADENCES}")
    if self.steps < 1 or self.eval_every < 1 or self.steps % self.eval_every:
      raise ValueError(f"steps={self.steps}, eval_every={self.eval_every}: expected positive "
                       f"integers with eval_every dividing steps")
    if self.probe_similarity not in linear.SIMILARITIES:
      raise ValueError(f"probe_similarity={self.probe_similarity!r}: expected one of "
                       f"{linear.SIMILARITIES}")
    if self.restarts < 0:
      raise ValueError(f"restarts={self.restarts}: expected ≥ 0 (0: the family's default; 1: a "
                       f"single initialisation)")
    if self.restart_steps < 0:
      raise ValueError(f"restart_steps={self.restart_steps}: expected ≥ 0 (0: half of steps)")
    if not 0 <= self.restart_holdout < 1:
      raise ValueError(f"restart_holdout={self.restart_holdout}: expected 0 ≤ h < 1")
    if self.solver not in SOLVERS:
      raise ValueError(f"solver={self.solver!r}: expected one of {SOLVERS}")
    if not self.solver_ridge >= 0:
      raise ValueError(f"solver_ridge={self.solver_ridge}: expected a number ≥ 0")
    if self.solver_starts < 0:
      raise ValueError(f"solver_starts={self.solver_starts}: expected ≥ 0 (0: the family's)")
    if self.solver_iterations < 0:
      raise ValueError(f"solver_iterations={self.solver_iterations}: expected a positive "
                       f"integer (0: the family's value)")
    if self.solver_projection not in (True, False, "auto"):
      raise ValueError(f"solver_projection={self.solver_projection!r}: expected True, False or "
                       f"'auto'")
    fewest = self.solver_iterations or min(PROJECTED_ITERATIONS.values())
    if not 0 <= self.solver_screen <= fewest:
      raise ValueError(f"solver_screen={self.solver_screen}: expected an integer from 0 (no "
                       f"screening) to solver_iterations ({fewest})")
    if self.weight_decay != "auto" and not (isinstance(self.weight_decay, (int, float))
                                            and self.weight_decay >= 0):
      raise ValueError(f"weight_decay={self.weight_decay!r}: expected 'auto' or a number ≥ 0")
    return self

  @property
  def candidate_steps(self):
    """Steps each restart candidate trains at a constant learning rate."""
    return self.restart_steps or max(1, self.steps // 2)

  def decay_for(self, family):
    """The weight decay a fit of `family` uses."""
    if self.weight_decay == "auto":
      return WEIGHT_DECAY[family]
    return float(self.weight_decay)

  def restarts_for(self, family):
    """The initialisations a fit of `family` tries."""
    return self.restarts or RESTARTS[family]

  def solver_for(self, model):
    """"coordinate" or "adam": how a fit of `model` is made."""
    if self.solver == "coordinate" and not coordinate.supports(model):
      raise ValueError(f"solver='coordinate': {model.name} at E = {model.width}, D = "
                       f"{model.out_dim}; expected an additive or product family at E = D "
                       f"without a learned W")
    if self.solver == "auto":
      return "coordinate" if coordinate.supports(model) else "adam"
    return self.solver

  def for_family(self, family):
    """This config with the family's defaults filled in (restarts, weight decay, the
    coordinate solver's starts, projection and steps)."""
    projection = self.solver_projection
    if projection == "auto":
      projection = SOLVER_PROJECTION[family]
    iterations = PROJECTED_ITERATIONS[family] if projection else FULL_ITERATIONS
    return dataclasses.replace(
        self, restarts=self.restarts_for(family), weight_decay=self.decay_for(family),
        solver_starts=self.solver_starts or SOLVER_STARTS[family],
        solver_iterations=self.solver_iterations or iterations, solver_projection=projection)


# The ORIGINAL settings reproduce the original code's single unregularised fit.
ORIGINAL = dict(standardize=False, weight_decay="0", restarts=1, solver="adam")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
  """What a command that fits approximators sets besides their FitConfig: the approximators'
  slot width and how their fits are chunked on the devices."""
  embed_dim: int = families.EMBED_DIM
  chunk_size: str = parallel.AUTO   # auto | none | n models at once (parallel.chunk_setting)
  memory_bytes: int = 0             # the memory "auto" chunks for; 0: the device's

  def validate(self):
    """Returns self; ValueError naming the bad field."""
    parallel.chunk_setting(self.chunk_size)
    if self.embed_dim < 0 or self.memory_bytes < 0:
      raise ValueError(f"embed_dim={self.embed_dim}, memory_bytes={self.memory_bytes}: expected "
                       "≥ 0")
    return self

  @property
  def chunks(self):
    """The chunk_size argument of `fit_grid` and `fit_models`."""
    return parallel.chunk_setting(self.chunk_size)

  @property
  def memory(self):
    """The memory_bytes argument of `fit_grid` and `fit_models` (None: the device's)."""
    return int(self.memory_bytes) or None
