"""Conformance probe entry point: imports the probe named by $PROBE (its state is
set up at import, i.e. at init, before the snapshot) and checks it when invoked."""
import importlib
import os
import traceback

import _probe

PROBE = importlib.import_module(os.environ['PROBE'])


def handler(event, context):
    try:
        PROBE.check()
    except _probe.Failure as e:
        return f'FAIL: {e}'
    except Exception as e:  # a check that crashes is a failure too, with where
        return f'FAIL: {type(e).__name__}: {e} at {traceback.format_tb(e.__traceback__)[-1].strip()}'
    return 'PASS'
