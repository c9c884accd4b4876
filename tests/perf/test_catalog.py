import pytest

from andante.perf.catalog import (
    get_hardware,
    get_model,
    hardware_names,
    model_names,
    save_hardware,
)
from andante.perf.paths import ANDANTE_HOME_ENV, hardware_profiles_dir
from andante.perf.specs import CostCoefficients, HardwareSpec


def _cpu_profile(name: str = "cpu") -> HardwareSpec:
    return HardwareSpec(name=name, peak_flops=2e12, mem_bandwidth=80e9,
                        mem_capacity=32 << 30, host_link_bandwidth=80e9,
                        interconnect_bandwidth=10e9,
                        coefficients=CostCoefficients(c2=1.0, c5=5e-3))


def test_catalog_lists_the_required_entries():
    assert set(model_names()) >= {"llama-3.1-8b", "mistral-7b", "qwen2.5-14b",
                                  "llama-3.1-70b", "phi-3-mini", "opt-13b", "smollm2-135m"}
    assert hardware_names()[:4] == ["a10-24g", "a100-40g", "a100-80g", "h100-80g"]
    for name in model_names():
        assert get_model(name).name == name


def test_unknown_model_lists_valid_names():
    with pytest.raises(ValueError, match="unknown model 'gpt-5'.*llama-3.1-8b"):
        get_model("gpt-5")


def test_unknown_hardware_lists_valid_names(tmp_path):
    with pytest.raises(ValueError, match="unknown hardware 'tpu-v9'.*a100-80g"):
        get_hardware("tpu-v9", profiles_dir=tmp_path)


def test_saved_profile_is_found(tmp_path):
    path = save_hardware(_cpu_profile(), profiles_dir=tmp_path)
    assert path == tmp_path / "cpu.json"
    assert get_hardware("cpu", profiles_dir=tmp_path) == _cpu_profile()
    assert "cpu" in hardware_names(tmp_path)


def test_default_profiles_dir_follows_andante_home(tmp_path, monkeypatch):
    monkeypatch.setenv(ANDANTE_HOME_ENV, str(tmp_path))
    assert hardware_profiles_dir() == tmp_path / "hardware"
    save_hardware(_cpu_profile())
    assert get_hardware("cpu").peak_flops == 2e12


def test_builtin_names_cannot_be_shadowed(tmp_path):
    with pytest.raises(ValueError, match="built-in"):
        save_hardware(_cpu_profile("a100-80g"), profiles_dir=tmp_path)


def test_profile_name_must_match_file(tmp_path):
    (tmp_path / "cpu.json").write_text(_cpu_profile("other").to_json())
    with pytest.raises(ValueError, match="named 'other'"):
        get_hardware("cpu", profiles_dir=tmp_path)


def test_broken_profile_names_the_file(tmp_path):
    (tmp_path / "cpu.json").write_text("{")
    with pytest.raises(ValueError, match="cpu.json"):
        get_hardware("cpu", profiles_dir=tmp_path)


def test_path_like_names_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="invalid hardware name"):
        get_hardware("../etc/passwd", profiles_dir=tmp_path)
