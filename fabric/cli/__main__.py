"""``python -m fabric.cli`` runs the ``agap`` command line."""

from fabric.cli import main

main()
