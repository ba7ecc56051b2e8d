"""Module-level state: survives between invocations of one process.

After a snapshot restore every clone starts from the snapshotted value (0).
"""

count = 0
print("counter: init, count=%d" % count)


def handler(event, context):
    global count
    count += 1
    return {"count": count}
