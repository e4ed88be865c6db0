"""The application built on the library: the training engine, methods by name, the UCI harness, the demo,
the GP experiment, the benchmark runner and the ``whvi`` command line.

Nothing in the library (:mod:`pyro_whvi.ops`, ``distributions``, ``infer``, ``nn``, ``init``, ``gp``,
``metrics``, ``data``) imports from here.

* :mod:`~pyro_whvi.train.engine` — :func:`~pyro_whvi.train.engine.train`, the one SVI loop
  (schedule, fixed-noise phase, minibatches, checkpoints, data-parallel).
* :mod:`~pyro_whvi.train.distributed` — launching and joining process groups.
* :mod:`~pyro_whvi.experiments.methods` — ``mfg``, ``mcd``, ``whvi``, ``nf-whvi``, ``vsd`` (``+iblm``), and
  ``ensemble`` (:mod:`~pyro_whvi.experiments.ensemble`: deep ensembles with mean-variance heads).
* :mod:`~pyro_whvi.experiments.uci` — ``whvi uci``; :mod:`~pyro_whvi.experiments.noisy_sets` — ``whvi synthetic``.
* :mod:`~pyro_whvi.experiments.demo`, :mod:`~pyro_whvi.experiments.gp`, :mod:`~pyro_whvi.experiments.bench`.
* :mod:`~pyro_whvi.experiments.reporting` — result tables (atomic writes) and shared plots.
"""
