"""The fabric's A2A v1.0 surface, built on the official ``a2a-sdk``.

* :mod:`fabric.apps.a2a.server` — ``build_app``/``serve``: Agent Cards and JSON-RPC per agent,
  behind the bearer gate (:mod:`fabric.apps.a2a.auth`), on uvicorn;
* :mod:`fabric.apps.a2a.service` — the shared state: sync calls run directly (through
  :mod:`fabric.apps.a2a.runner`, the workers' model path) and are journaled afterwards; async
  calls become fabric tasks; scoping, the push watch;
* :mod:`fabric.apps.a2a.handler` — the SDK's request handler per agent: get, list, cancel,
  push configs, subscribe; :mod:`fabric.apps.a2a.send` — ``SendMessage``: new messages,
  dedupe of retries, follow-ups to input-required tasks;
* :mod:`fabric.apps.a2a.client` — the SDK client with a bearer token (``agap a2a call``).

Importing this package needs the ``a2a`` extra (``a2a-sdk[http-server]``, ``uvicorn``);
the rest of the fabric never imports it.
"""
