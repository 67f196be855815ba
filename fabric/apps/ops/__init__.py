"""The ops-agent (``agap ops``): Zabbix problems become mitigations or tasks."""
