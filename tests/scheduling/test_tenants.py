"""A tenants config with a mistake is refused with the field and the rule named."""

from __future__ import annotations

import pytest

from fm_pipeline.scheduling import TenantsConfigError, load_tenants, parse_tenants


def test_embedded_default_loads():
    config = load_tenants()
    assert config.tenant_names == ["research", "prod", "eval"]
    assert config.shared_pool() == {"gpu": 2}


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"pool": {"gpu": 5}}, "tenants", "gpu quotas sum to 6"),
        ({"pool": {"cpu": 8}}, "pool", "must list gpu"),
        ({"tenants": [{"name": "Bad_Name"}]}, "tenants.0.name", "lowercase"),
        ({"tenants": [{"name": "a", "priorities": ["vip"]}]}, "tenants.0.priorities",
         "unknown priority class vip"),
        ({"tenants": [{"name": "a", "quota": {"gpu": -1}}]}, "tenants.0.quota", "must be >= 0"),
        ({"tenants": [{"name": "a"}, {"name": "a"}]}, "tenants", "repeated: a"),
        ({"tenants": [{"name": "a", "wieght": 2}]}, "tenants.0.wieght", "Extra inputs"),
        ({"tenants": [{"name": "a", "quota": {"tpu": 1}}]}, "tenants.0.quota.tpu", "Input should be"),
    ],
)
def test_bad_config_names_the_field(change, field, message):
    data = {"pool": {"gpu": 8}, "tenants": [{"name": "a", "quota": {"gpu": 3}},
                                              {"name": "b", "quota": {"gpu": 3}}]}
    data.update(change)
    with pytest.raises(TenantsConfigError) as err:
        parse_tenants(data, source="t.yaml")
    assert any(f == field and message in m for f, m in err.value.problems), err.value.problems
    assert "t.yaml" in str(err.value)


def test_missing_file_is_named(tmp_path):
    with pytest.raises(TenantsConfigError, match="no such file"):
        load_tenants(tmp_path / "nope.yaml")
