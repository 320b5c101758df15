"""The sweep metrics the report reads: the figure ρ* is fitted to and every curve it draws."""
from bindjax.workdir import results

# Metric names of bindjax.training.train.eval_step; results.ROW_K stands for each row's K (the
# maximum number of objects per scene).
BINDING_METRIC = results.object_accuracy(results.HELDOUT, results.ROW_K)
ONE_OBJECT_METRIC = results.object_accuracy(results.HELDOUT, 1)
CONCEPT_METRIC = results.concept_accuracy(results.HELDOUT)
# ρ* may be read off either held-out figure (docs/objectives.md#binding): set-separation accuracy
# on max-object scenes, or the binding figure (both objects above every cross object).
RHO_METRICS = {"accuracy": BINDING_METRIC, "binding": results.binding(results.HELDOUT)}
# Every metric the report aggregates and draws (the ρ* metric first).
REPORT_METRICS = (BINDING_METRIC, results.binding(results.HELDOUT),
                  results.object_accuracy(results.TRAIN, results.ROW_K),
                  results.binding(results.TRAIN), ONE_OBJECT_METRIC, CONCEPT_METRIC)
