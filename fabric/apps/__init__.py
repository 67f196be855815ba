"""Applications above the library: the `agap` CLI, the A2A surface, deployment,
the web view, the cron submitter and coding workspaces. Nothing in the library imports them."""
