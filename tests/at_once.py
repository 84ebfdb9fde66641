"""What the tests of concurrent callers share: calls made from several threads at once,
and the local Ray instance the Ray tests start."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def at_once(call: Callable[[int], None], count: int) -> None:
    """``call(0)`` to ``call(count - 1)``, each in its own thread, all started before any
    is waited for."""
    threads = [threading.Thread(target=call, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def start_local_ray(**options: Any) -> None:
    """A local Ray instance on two CPUs (the machines the issues measure on), quiet."""
    import ray

    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="ERROR",
        log_to_driver=False,
        configure_logging=False,
        **options,
    )
