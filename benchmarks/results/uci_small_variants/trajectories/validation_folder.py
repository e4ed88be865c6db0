"""A probe's helper (not part of the library): the held-out rows ``whvi uci`` would validate on, as a data folder.

Writes OUT in the UCI split format with one split, 0: its training rows the fit part of SOURCE's split SPLIT and its
test rows the held-out part, as :func:`~pyro_whvi.experiments.uci_train.validation_part` draws them
(:func:`~pyro_whvi.train.selection.holdout` of ``val_fraction`` 0.2 with the seed ``0 + SPLIT``, the defaults of
:class:`~pyro_whvi.experiments.uci_config.UCIConfig`). ``trajectory.py OUT 0 ...`` then scores the held-out rows
along one run: the validation score a choice of the step count would see (the targets here are standardized on
the fit rows, where the harness uses all the training rows: the MNLL in original units does not depend on it).
``README.json`` (σ of a ``whvi synthetic`` set) and ``noise_std.txt`` are copied when SOURCE has them.

usage: python validation_folder.py SOURCE SPLIT OUT
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from pyro_whvi.experiments.uci_config import UCIConfig
from pyro_whvi.train.files import write_atomic
from pyro_whvi.train.selection import holdout

source, split, out = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
train = [line for line in (source / f"index_train_{split}.txt").read_text().split() if line]
defaults = UCIConfig()
fit, held = holdout(len(train), defaults.val_fraction, defaults.seed + split)
out.mkdir(parents=True, exist_ok=True)
for name in ("data.txt", "index_features.txt", "index_target.txt", "README.json", "noise_std.txt"):
    if (source / name).exists():
        shutil.copyfile(source / name, out / name)
write_atomic(out / "index_train_0.txt", "".join(f"{train[i]}\n" for i in fit.tolist()))
write_atomic(out / "index_test_0.txt", "".join(f"{train[i]}\n" for i in held.tolist()))
