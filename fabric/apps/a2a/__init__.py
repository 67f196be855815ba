"""The fabric's A2A v1.0 surface, built on the official ``a2a-sdk``.

* :mod:`fabric.apps.a2a.server` — ``build_app``/``serve``: Agent Cards and JSON-RPC per agent,
  behind the bearer gate (:mod:`fabric.apps.a2a.auth`), on uvicorn;
* :mod:`fabric.apps.a2a.service` — the shared state: sync calls run directly (through
  :mod:`fabric.apps.a2a.runner`, the workers' model path) and are journaled afterwards; async
  calls become fabric tasks; scoping, the push watch;
* :mod:`fabric.apps.a2a.handler` — the SDK's request handler per agent: get, list, cancel,
  push configs, subscribe; :mod:`fabric.apps.a2a.send` — ``SendMessage``: new messages,
  dedupe of retries, follow-ups to input-required tasks;
* :mod:`fabric.apps.a2a.admission` — sync calls checked and counted in the agent's a(t);
  :mod:`fabric.apps.a2a.push` — push targets, durable configs, delivery with retries;
  :mod:`fabric.apps.a2a.checks` — request checks the SDK's parsing cannot make;
* :mod:`fabric.apps.a2a.client` — the SDK client with a bearer token and optional client
  certificate (``agap a2a call``).

Importing this package needs the ``a2a`` extra (``a2a-sdk[http-server]``, ``uvicorn``);
the rest of the fabric never imports it.
"""
