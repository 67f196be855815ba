"""Running the fabric as a service: the compose stack, backup and restore, the eval gate.

* :mod:`fabric.deploy.render` — ``agap compose render``: the LiteLLM proxy config and one
  worker service per queue, generated from the cards;
* :mod:`fabric.deploy.backup` — ``agap backup`` / ``agap restore``: every fabric task to a
  file and back into an empty board;
* :mod:`fabric.deploy.evalgate` — ``agap eval``: replay a golden set through the current
  and a proposed backbone and refuse a regression;
* :mod:`fabric.deploy.health` — the container healthchecks.
"""
