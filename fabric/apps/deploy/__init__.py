"""Running the fabric as a service: the compose stack, backup and restore, the eval gate.

* :mod:`fabric.apps.deploy.render` — ``agap compose render``: the LiteLLM proxy config and one
  worker service per queue, generated from the cards;
* :mod:`fabric.apps.deploy.backup` — ``agap backup`` / ``agap restore``: every fabric task to a
  file and back into an empty board;
* :mod:`fabric.apps.deploy.evalgate` — ``agap eval``: replay a golden set through the current
  and a proposed backbone and refuse a regression;
* :mod:`fabric.apps.deploy.health` — the container healthchecks.
"""
