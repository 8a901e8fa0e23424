"""The CLI's persistent compilation cache: where it goes, and that a user's choice wins."""

import os
import subprocess
import sys

import pytest

PROBE = ("import jax; from jaxrl_async.compilation_cache import enable_compilation_cache; "
         "enable_compilation_cache(); print(jax.config.jax_compilation_cache_dir or 'off')")


@pytest.mark.parametrize("env, want", [
    ({}, "{tmp}/jaxrl_async/jax"),
    ({"JAXRL_COMPILATION_CACHE": "0"}, "off"),
    ({"JAX_COMPILATION_CACHE_DIR": "/elsewhere"}, "/elsewhere"),
])
def test_the_cache_goes_under_xdg_cache_home_unless_the_user_chose(tmp_path, env, want):
    base = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                          env={**base, "XDG_CACHE_HOME": str(tmp_path), **env})
    assert proc.stdout.strip().splitlines()[-1] == want.format(tmp=tmp_path)
