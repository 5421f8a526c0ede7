"""Joining or starting a Ray instance for `unmask serve --replicas` and `--data-parallel`: the
address is checked before anything starts, and a cluster that cannot be reached is an UnmaskError
within seconds (Ray itself retries a refused address for minutes)."""

import os
import socket
import threading

from unmask.errors import UnmaskError

CONNECT_TIMEOUT_S = 25.0  # joining a cluster that answers but never completes the handshake
# A local instance's settings for a machine shared with other work (set only where the user has not;
# Ray's processes inherit them from this one):
# - RAY_worker_niceness 0: Ray starts its workers at niceness 15, below every ordinary process, so on
#   busy cores the replicas (the server itself) and Serve's controller get almost no CPU: requests
#   crawl, and a Ctrl-C's graceful shutdown waits on them (issue 33). Ray's own job manager sets 0
#   for the drivers it starts, for the same reason.
# - Serve's proxy timeouts: its defaults (ready within 5 s, health answered within 10 s) kill a proxy
#   that a loaded 2-core machine starts slowly, and serve.start then fails with ActorDiedError.
LOCAL_ENV = {"RAY_worker_niceness": "0", "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
             "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30"}
_FORMS = "'auto' (the Ray instance running on this machine), HOST:PORT or ray://HOST:PORT"


def parse_ray_address(address: str | None, flag: str = "--ray-address") -> tuple[str, int] | None:
    """(host, port) of an address to join, None for 'auto' or no address (a new local instance);
    an UnmaskError naming the flag and the value for anything else."""
    if address is None or address == "auto":
        return None
    if not isinstance(address, str) or not address.strip():
        raise UnmaskError(f"{flag} {address!r} is not a Ray address; give {_FORMS}")
    text = address.strip()
    if text.startswith("ray://"):
        text = text[len("ray://"):]
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host or " " in host:
        raise UnmaskError(f"{flag} {address!r} is not a Ray address; give {_FORMS}")
    return host, int(port)


def check_reachable(address: str | None, flag: str = "--ray-address", timeout: float = 5.0) -> None:
    """A TCP connection to the address's port (its GCS, or a Ray client server) opens within
    `timeout`; else an UnmaskError."""
    hostport = parse_ray_address(address, flag)
    if hostport is None:
        return
    try:
        with socket.create_connection(hostport, timeout=timeout):
            pass
    except OSError as e:
        raise UnmaskError(f"{flag} {address!r}: no Ray cluster answers there ({e.strerror or e}); start one with "
                          "`ray start --head` or leave the flag out to start a local instance") from None


def init_ray(address: str | None, flag: str = "--ray-address", **kwargs) -> None:
    """ray.init: a new local instance without an address ('local': never one another program
    started here), else the cluster at `address`, checked first and joined within CONNECT_TIMEOUT_S."""
    import ray

    parse_ray_address(address, flag)
    check_reachable(address, flag)
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", False)
    if address is None:
        for name, value in LOCAL_ENV.items():
            os.environ.setdefault(name, value)
        ray.init(address="local", **kwargs)
        return
    outcome: list = []

    def join() -> None:
        try:
            ray.init(address=address, **kwargs)
            outcome.append(None)
        except Exception as e:  # Ray's own words: no instance at 'auto', a version mismatch, ...
            outcome.append(e)

    t = threading.Thread(target=join, daemon=True, name="unmask-ray-init")
    t.start()
    t.join(CONNECT_TIMEOUT_S)
    if not outcome:
        raise UnmaskError(f"{flag} {address!r}: the Ray cluster did not accept this process within "
                          f"{CONNECT_TIMEOUT_S:g} s")
    if outcome[0] is not None:
        e = outcome[0]
        raise UnmaskError(f"{flag} {address!r}: could not join the Ray cluster ({type(e).__name__}: "
                          f"{str(e).splitlines()[0][:300] if str(e) else ''})") from None
