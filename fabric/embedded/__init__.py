"""The embedded Kanboard-compatible board: SQLite behind Kanboard's JSON-RPC API.

It exists so the fabric runs on a fresh machine with no PHP, and so integration tests
talk real HTTP to something with Kanboard's semantics. The contract suite in
``tests/contract`` holds it to the same assertions as a real Kanboard.
"""
