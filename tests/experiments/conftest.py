"""Fixtures of the ``whvi`` command's tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def uci_configs(monkeypatch) -> list:
    """The :class:`~pyro_whvi.experiments.uci_config.UCIConfig` each ``whvi uci`` command of the test resolves to, in
    order: ``run_uci`` is replaced by a recorder, so nothing trains."""
    from pyro_whvi.experiments import uci

    configs: list = []

    def record(source, config, out, **kwargs):
        configs.append(config)
        return [], ""

    monkeypatch.setattr(uci, "run_uci", record)
    return configs
