"""The fabric's A2A v1.0 surface, built on the official ``a2a-sdk``.

* :mod:`fabric.apps.a2a.server` — ``build_app``/``serve``: Agent Cards and JSON-RPC per agent,
  behind the bearer gate (:mod:`fabric.apps.a2a.auth`), on uvicorn;
* :mod:`fabric.apps.a2a.service` — sync calls run directly and are journaled afterwards; async
  calls become fabric tasks; scoping, dedupe, cancel, input-required, push;
* :mod:`fabric.apps.a2a.client` — the SDK client with a bearer token (``agap a2a call``).

Importing this package needs the ``a2a`` extra (``a2a-sdk[http-server]``, ``uvicorn``);
the rest of the fabric never imports it.
"""
