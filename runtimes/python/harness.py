"""The Python shim's test harness: runtimes/harness.py (one stand-in for the
Rust node for every runtime) bound to the Python runtime.

Kept as its own module so the Python shim's tests can `import harness` and
write `harness.Runtime(code_dir, handler)`. Run runtimes/harness.py directly
for the command-line harness.
"""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "thaw_runtime_harness", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "harness.py"))
_generic = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_generic)

recv_frame = _generic.recv_frame
send_frame = _generic.send_frame


class Runtime(_generic.Runtime):
    """A running bootstrap.py with its control socket (memory 128 MiB, as Lambda's default)."""

    def __init__(self, code_dir, handler, env=None, function_name="test-fn"):
        # The shim always runs under /usr/bin/python3, the interpreter the sandbox provides.
        super().__init__("python", code_dir, handler, env=env, function_name=function_name, memory_mb=128)
