"""The template imports whole into Zabbix 7.0's frontend (Debian 13's 7.0 packages, unpacked:
Debian 12 cannot run a 7.0 server, but the 7.0 frontend runs on its PHP 8.2 and checks an
import). ``.ci/run`` unpacks them into /var/cache/agap-tests/zabbix70; ``AGAP_TEST_ZABBIX70_ROOT`` names
another folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from fabric.apps.ops.zabbix import ZabbixError
from tests.conftest import ROOT
from tests.integration.zabbix_real import import_rules, missing, real_zabbix

TEMPLATE = ROOT / "compose" / "zabbix" / "agap_fabric_zbx_template.yaml"
ZABBIX70_ROOT = Path(os.environ.get("AGAP_TEST_ZABBIX70_ROOT", "/var/cache/agap-tests/zabbix70"))
WHY = missing(ZABBIX70_ROOT, server=False)
pytestmark = pytest.mark.skipif(
    WHY is not None, reason=f"no Zabbix 7.0 frontend unpacked ({WHY}); .ci/run unpacks Debian 13's"
)


@pytest.mark.timeout(600)
def test_the_6_0_export_imports_whole_into_zabbix_7_0() -> None:
    with real_zabbix(ZABBIX70_ROOT, server=False) as zbx:
        api = zbx.api
        assert api.version() == (7, 0)
        source = TEMPLATE.read_text()
        # 7.0 names the rule template_groups: 6.0's `groups` is refused, not ignored.
        with pytest.raises(ZabbixError, match='unexpected parameter "groups"'):
            api.call(
                "configuration.import", {"format": "yaml", "source": source, "rules": import_rules((6, 0))}
            )
        assert api.call(
            "configuration.import", {"format": "yaml", "source": source, "rules": import_rules(api.version())}
        )
        (tpl,) = api.call(
            "template.get", {"filter": {"host": "AGAP fabric keeper"}, "output": ["templateid"]}
        )
        tid = tpl["templateid"]
        (src,) = yaml.safe_load(source)["zabbix_export"]["templates"]
        protos = [p for r in src["discovery_rules"] for p in r["item_prototypes"]]

        def count(method: str) -> int:
            return int(api.call(method, {"templateids": tid, "countOutput": True}))

        assert count("item.get") == len(src["items"])
        assert count("discoveryrule.get") == len(src["discovery_rules"])
        assert count("itemprototype.get") == len(protos)
        assert count("trigger.get") == 3 and count("triggerprototype.get") == 4
        (up,) = api.call(
            "item.get",
            {"templateids": tid, "filter": {"key_": "agap.keeper.up"}, "output": ["type", "params"]},
        )
        assert up["type"] == "15" and "agap.keeper.answered" in up["params"]  # 15: calculated
        tags = api.call("trigger.get", {"templateids": tid, "selectTags": "extend", "output": ["triggerid"]})
        assert all(any(t["tag"] == "agap.class" for t in trig["tags"]) for trig in tags)
