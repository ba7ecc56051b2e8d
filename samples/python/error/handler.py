"""Raises ValueError when the event asks for it (error-path test)."""


def handler(event, context):
    if isinstance(event, dict) and "fail" in event:
        raise ValueError("bad input: %r" % (event["fail"],))
    return {"ok": True}
