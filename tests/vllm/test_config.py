"""andante.vllm's settings and per-request SLOs: no vLLM needed."""

from __future__ import annotations

import pytest

from andante.core.sampling import SLO
from andante.vllm.config import (
    POLICIES,
    TESTED_VLLM_VERSIONS,
    AdapterConfig,
    ConfigError,
    check_version,
    parse_config,
)
from andante.vllm.mirror import SLOError, slo_from_extra_args


def test_defaults_without_additional_config() -> None:
    assert parse_config(None) == AdapterConfig()
    assert parse_config({"andante": {"policy": "edf"}}).policy == "edf"


@pytest.mark.parametrize("raw, message", [
    ({"andante": {"policy": "lottery"}}, "unknown policy 'lottery'"),
    ({"andante": {"policy": "andes", "step_logs": "x"}}, "step_logs"),
    ({"andante": "andes"}, "must be an object"),
    ({"andante": {"policy_options": [1]}}, "policy_options"),
    ({"andante": {"log_interval": -1}}, "log_interval"),
    ({"andante": {"hardware": 3}}, "hardware"),
])
def test_bad_settings_are_one_clear_line(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        parse_config(raw)
    assert "\n" not in str(info.value)


def test_every_policy_is_registered_in_andante() -> None:
    from andante.policies import policy_names

    assert set(POLICIES) <= set(policy_names())


def test_untested_vllm_version_names_the_tested_ones() -> None:
    check_version(TESTED_VLLM_VERSIONS[0])
    with pytest.raises(ConfigError, match="0.32.0.*not 0.99.0"):
        check_version("0.99.0")


def test_slo_from_vllm_xargs() -> None:
    assert slo_from_extra_args(None) == SLO()
    assert slo_from_extra_args({"other": 1}) == SLO()
    assert slo_from_extra_args({"ttft": "0.5", "tds": 10, "tbt": 0.2, "deadline": 30}) == \
        SLO(ttft=0.5, tbt=0.2, tds=10.0, deadline=30.0)


@pytest.mark.parametrize("xargs", [{"ttft": -1}, {"tds": "fast"}, {"deadline": 0}])
def test_bad_slo_is_refused(xargs: dict) -> None:
    with pytest.raises(SLOError, match="vllm_xargs"):
        slo_from_extra_args(xargs)
