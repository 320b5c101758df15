"""Binding-function complexity (docs/complexity.md): which function families of a scene's
concept values reproduce its embedding on objects never seen in training.

Modules: `data` (scenes and object-level splits), `families` (approximators), `fit_settings`
(a fit's settings and each family's defaults), `fitting` (batched fitting and scoring with
frozen probes), `fit_programs` (the compiled per-model programs of a fit), `grid_fits` (grids
of fits and their result rows), `trees` (scikit-learn approximators on the same splits),
`results` (CSV and the summary over seeds), `figure`, `description_length` (prequential code
length per family), `analysis` (the `bindjax complexity` flow) and `replicas` (every replica of
a sweep fitted on its own split: the `bindjax binding` flow).
"""
