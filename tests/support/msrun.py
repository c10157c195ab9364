"""The harness of the data-parallel tests, which start 2 CPU ranks through ``msrun`` on 127.0.0.1."""
import socket


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for msrun's ``--master_port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: str, n: int = 40) -> str:
    """The last ``n`` lines of a worker's log ("" if it was never written), for a failure message."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""
