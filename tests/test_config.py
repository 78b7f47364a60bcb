"""Config: batch sizes per device, validation of settings."""

from __future__ import annotations

import pytest

from bertknn_search.config import CPU_BATCH, GPU_BATCH, Config
from bertknn_search.errors import ConfigError


def test_batch_size_follows_the_device_unless_given() -> None:
    assert Config().batch_for("cpu") == CPU_BATCH
    assert Config().batch_for("cuda") == GPU_BATCH > CPU_BATCH
    assert Config(batch_size=7).batch_for("cuda") == Config(batch_size=7).batch_for("cpu") == 7


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"batch_size": 0}, "--batch-size must be >= 1"),
        ({"k": 0}, "-k must be >= 1"),
        ({"lam": 1.5}, r"--lambda must be in \[0, 1\]"),
    ],
)
def test_out_of_range_settings_are_config_errors(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config(**settings)  # type: ignore[arg-type]
