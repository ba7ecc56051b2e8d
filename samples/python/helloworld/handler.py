"""Smallest possible function."""


def handler(event, context):
    name = "world"
    if isinstance(event, dict):
        name = event.get("name", "world")
    return {"message": "hello, " + str(name)}
