"""``python -m fabric.apps.cli`` runs the ``agap`` command line."""

from fabric.apps.cli import run

run()
