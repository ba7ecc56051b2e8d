"""Snapshot hooks for Python functions on Thaw (importable as `thaw_runtime`).

    import thaw_runtime

    def reconnect():
        ...
    thaw_runtime.register_after_restore(reconnect)

`register_before_snapshot(fn)`: fn() runs once after the handler module was
imported, right before the instance reports ready (and is snapshotted).
`register_after_restore(fn)`: fn() runs in every instance restored from the
snapshot, before its first invocation (after the runtime reseeded `random`).
Both return fn, so they can be used as decorators.  The shim imports this
module before the function's, so every `import thaw_runtime` gets this copy.
"""

_before_snapshot = []
_after_restore = []


def register_before_snapshot(fn):
    if not callable(fn):
        raise TypeError("register_before_snapshot expects a callable")
    _before_snapshot.append(fn)
    return fn


def register_after_restore(fn):
    if not callable(fn):
        raise TypeError("register_after_restore expects a callable")
    _after_restore.append(fn)
    return fn


def _run_before_snapshot():
    for fn in list(_before_snapshot):
        fn()


def _reseed():
    """Give this clone its own random state (every clone starts from the snapshot's)."""
    import os
    import sys
    # Only modules the function (or its libraries) already imported hold random
    # state; importing one here would only cost the clone time and page faults
    # (a module imported later seeds itself from os.urandom).
    random = sys.modules.get("random")
    if random is not None:
        random.seed()  # from os.urandom
    ssl = sys.modules.get("ssl")
    if ssl is not None:
        try:
            ssl.RAND_add(os.urandom(32), 32.0)  # OpenSSL's DRBG
        except Exception:
            pass
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None  # its own Random, created lazily again
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            np_random.seed()
        except Exception:
            pass


def _needs_restore_notice():
    """Whether a restored clone has anything to reseed or run: after-restore hooks,
    or a module holding random state. If not, the node may skip the `restored`
    round trip (and the page faults running it would cost a lazy restore)."""
    import sys
    return bool(_after_restore) or any(
        m in sys.modules for m in ("random", "ssl", "tempfile", "numpy.random"))


def _run_after_restore():
    _reseed()
    for fn in list(_after_restore):
        fn()
