"""The k3 binary under test, for the pytest files: K3_BUILD (default build/) and one runner."""
import os
import pathlib
import subprocess

BUILD = pathlib.Path(os.environ.get("K3_BUILD", "build"))
K3 = BUILD / "k3"


def k3(*args):
    """Runs build/k3 with args (any type, made str); captured text output, no leak check."""
    return subprocess.run([str(K3), *map(str, args)], capture_output=True, text=True,
                          env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
