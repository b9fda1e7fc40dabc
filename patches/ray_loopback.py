"""Keep a local Ray 2.x head on loopback: every listener on 127.0.0.1, no probes leaving the machine.

Why: `ray.init(_node_ip_address="127.0.0.1")` is not enough. On Linux Ray replaces a loopback node
address by the address it finds "from the perspective" of 8.8.8.8 unless
`ray._private.ray_constants.ENABLE_RAY_CLUSTER` is False (env `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`);
every Ray server then binds to that address. And the dashboard head (started even with
`include_dashboard=False`, for usage stats) probes cloud metadata addresses; it is started behind
a loopback proxy that refuses, and the environment is restored right after, so nothing else sees it.

`apply()` must run before `ray.init`; it is idempotent. Single-node only: joining a cluster via
RAY_ADDRESS does not use it.
"""

from __future__ import annotations

import functools
import os

SUPPORTED_RAY_MAJOR = "2."
LOOPBACK_MARKER = "fullasync_loopback"  # set on the wrapped start_api_server, for idempotence
_DEAD_PROXY = "http://127.0.0.1:9"  # discard port: nothing listens, requests fail at once on loopback
_PROXY_ENV = {
    "http_proxy": _DEAD_PROXY, "HTTP_PROXY": _DEAD_PROXY, "https_proxy": _DEAD_PROXY, "HTTPS_PROXY": _DEAD_PROXY,
    "no_proxy": "localhost,127.0.0.1,::1", "NO_PROXY": "localhost,127.0.0.1,::1",
}


def _behind_dead_proxy(start_api_server):
    @functools.wraps(start_api_server)
    def wrapped(*args, **kwargs):
        saved = {key: os.environ.get(key) for key in _PROXY_ENV}
        os.environ.update(_PROXY_ENV)
        try:
            return start_api_server(*args, **kwargs)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    setattr(wrapped, LOOPBACK_MARKER, True)
    return wrapped


def apply() -> None:
    import ray
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services

    if not ray.__version__.startswith(SUPPORTED_RAY_MAJOR):
        raise RuntimeError(f"fullasync_patches.ray_loopback was written for Ray 2.x, found {ray.__version__}; "
                           "re-check it")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read by every Ray process at import
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process imported ray already
    if not getattr(services.start_api_server, LOOPBACK_MARKER, False):
        services.start_api_server = _behind_dead_proxy(services.start_api_server)
