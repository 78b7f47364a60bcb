"""Config: batch sizes per device, validation of settings."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from bertknn_search.config import (
    CPU_BATCH,
    GPU_BATCH,
    Config,
    env_settings,
    read_settings_file,
    settings_file_values,
)
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
        ({"lam": math.nan}, r"--lambda must be in \[0, 1\], got nan"),
        ({"temperature": math.nan}, "--temperature must be a finite number > 0, got nan"),
        ({"temperature": math.inf}, "--temperature must be a finite number > 0, got inf"),
        ({"gate_thresholds": (("top1", "*", math.nan),)}, "gate thresholds must be finite numbers"),
        ({"gate_thresholds": (("entropy", "P19", -math.inf),)}, "gate thresholds must be finite numbers"),
    ],
)
def test_out_of_range_settings_are_config_errors(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config(**settings)  # type: ignore[arg-type]


def test_environment_variables_and_their_origin() -> None:
    env = {"BERTKNN_MODEL": "m", "OPENSEARCH_VERIFY": "false", "BERTKNN_DEVICE": ""}
    assert env_settings(env) == {
        "model": ("m", "BERTKNN_MODEL"),
        "opensearch_verify": (False, "OPENSEARCH_VERIFY"),
    }
    assert Config.from_env(env, model="flag").model == "flag"
    with pytest.raises(ConfigError, match="OPENSEARCH_VERIFY must be true or false, got 'maybe'"):
        env_settings({"OPENSEARCH_VERIFY": "maybe"})


def test_a_settings_file_reads_back_what_it_was_written_as(tmp_path: Path) -> None:
    values = {"n_articles": 2, "k": 64, "temperature": 1.0, "lam": 0.5, "use_ir": False}
    written = settings_file_values(values)
    assert written == {"n-articles": 2, "k": 64, "temperature": 1.0, "lambda": 0.5, "no-ir": True}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(written))
    assert read_settings_file(path) == values


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 400])
@pytest.mark.parametrize(
    ("template", "where"),
    [
        ('{{"temperature": {}}}', "temperature"),
        ('{{"lambda": {}}}', "lambda"),
        ('{{"lam": {}}}', "lam"),
        ('{{"gate-thresholds": {{"top1": {{"*": 0.5, "P19": {}}}}}}}', "gate threshold top1/P19"),
    ],
)
def test_a_settings_file_refuses_nan_and_infinities(
    tmp_path: Path, template: str, where: str, value: str
) -> None:
    path = tmp_path / "s.json"
    path.write_text(template.format(value))  # Python's json reads NaN and Infinity as floats
    with pytest.raises(ConfigError, match=re.escape(f"{path}: {where} must be a finite number")):
        read_settings_file(path)


def test_the_extremes_of_each_range_are_settings() -> None:
    smallest, largest = 5e-324, sys.float_info.max
    for temperature in (smallest, largest):
        assert Config(temperature=temperature).temperature == temperature
    assert Config(lam=0.0).lam == 0.0 and Config(lam=1.0).lam == 1.0
    edges = (("top1", "*", -largest), ("entropy", "*", largest), ("popularity", "*", 0.0))
    assert Config(gate="top1", gate_thresholds=edges).thresholds("entropy") == {"*": largest}
