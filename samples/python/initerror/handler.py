"""Fails at import time (init-failure reporting test)."""

raise RuntimeError("initerror: failing at import on purpose")


def handler(event, context):  # never reached
    return {"ok": True}
