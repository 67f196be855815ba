"""Loopback stand-ins for services the fabric talks to (model providers, Langfuse)."""
