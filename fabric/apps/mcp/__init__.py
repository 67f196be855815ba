"""The fabric as MCP tools: one agent card's queue, submits and questions over the Model
Context Protocol, for runtimes that speak it (a Claude Code loop, OpenClaw personas).

* :mod:`fabric.apps.mcp.agent` — :class:`~fabric.apps.mcp.agent.AgentTools`: what the tools
  do, scoped to one card, on the library's own paths (the CLI's ``submit``, ``claim``,
  ``heartbeat``, ``complete``, ``fail``, ``ask``, ``show``), plus the lease renewer. No
  MCP SDK here.
* :mod:`fabric.apps.mcp.server` — the official ``mcp`` SDK's ``MCPServer``: the tools and
  resources, their descriptions, errors as tool errors; stdio, or streamable HTTP on
  loopback behind a mandatory bearer token.

Importing :mod:`fabric.apps.mcp.server` needs the ``mcp`` extra; the rest of the fabric
never imports it (``agap mcp serve`` imports it when it runs).
"""
