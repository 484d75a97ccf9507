"""What each PostgreSQL version offers, as the router detects it from server_version_num."""

from __future__ import annotations

import pytest

from router.postgres.server_features import ServerFeatures
from tests.helpers import config_head

CASES = [  # version, proto, origin option, standby decoding, failover slots, generated columns
    (150014, 3, False, False, False, False),
    (160010, 4, True, True, False, False),
    (170006, 4, True, True, True, False),
    (180006, 4, True, True, True, True),
]


@pytest.mark.parametrize("version,proto,origin,standby,failover,gencols", CASES)
def test_features_by_version(version, proto, origin, standby, failover, gencols):
    f = ServerFeatures(version)
    assert (f.max_proto_version, f.origin_option, f.standby_decoding, f.failover_slots,
            f.generated_columns) == (proto, origin, standby, failover, gencols)


def test_a_missing_feature_is_named_with_the_version_that_has_it():
    msg = ServerFeatures(160010).lacks("failover slots (synchronised to a standby)")
    assert msg == ("PostgreSQL 16 has no failover slots (synchronised to a standby); it needs "
                   "PostgreSQL 17 or later")


def test_origin_filtering_is_pushed_to_the_server_only_for_none_on_16_and_later():
    from router.config.router import parse_config
    from router.stream.origins import rules_from_config

    def origin_filtering(cfg, version):
        return rules_from_config(cfg).filtering_at(version)

    def cfg(origin: str):
        return parse_config(f"{origin}\n" + config_head("postgresql://x/db") + f"""[[routes]]
name = "r"
tables = ["public.t"]
topic = "t"
""")
    assert origin_filtering(cfg('origin = "none"'), 150014) == "client"
    assert origin_filtering(cfg('origin = "none"'), 160010) == "server"
    assert origin_filtering(cfg(""), 180006) == "off"
    assert origin_filtering(cfg('origin = { deny = ["node_b"] }'), 180006) == "client"
