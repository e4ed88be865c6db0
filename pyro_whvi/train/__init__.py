"""Training: the library's one training engine and what it is built from.

Benchmarks, tutorials and the application (:mod:`pyro_whvi.experiments`) train through this package:

* :mod:`~pyro_whvi.train.engine` — :func:`~pyro_whvi.train.engine.train`, the one SVI loop (schedule,
  fixed-noise phase, KL weight, minibatches, checkpoints, data-parallel), and
  :func:`~pyro_whvi.train.engine.optimize` for plain losses (the GP);
* :mod:`~pyro_whvi.train.schedule` — :class:`~pyro_whvi.train.schedule.Schedule` (learning rate),
  :class:`~pyro_whvi.train.schedule.Minibatches` (the one minibatch sampler);
* :mod:`~pyro_whvi.train.stops` — :class:`~pyro_whvi.train.stops.TrainingDiverged` and
  :class:`~pyro_whvi.train.stops.TrainingInterrupted`, why a run stopped early;
* :mod:`~pyro_whvi.train.checkpoints` — what a run saves and resumes from;
* :mod:`~pyro_whvi.train.distributed` — launching and joining process groups;
* :mod:`~pyro_whvi.train.selection` — held-out rows, early stopping, and the best of several candidates;
* :mod:`~pyro_whvi.train.files` — result files written atomically.

It imports the library below it (``infer``) and nothing of the application.
"""

from . import checkpoints, distributed, engine, files, schedule, selection, stops
from .engine import optimize, train
from .schedule import Minibatches, Schedule
from .stops import TrainingDiverged, TrainingInterrupted

__all__ = [
    "Minibatches",
    "Schedule",
    "TrainingDiverged",
    "TrainingInterrupted",
    "checkpoints",
    "distributed",
    "engine",
    "files",
    "optimize",
    "schedule",
    "selection",
    "stops",
    "train",
]
