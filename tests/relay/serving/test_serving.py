"""The pieces `relay.serving.server` adds around uvicorn: per-worker sockets and the frozen heap."""

from __future__ import annotations

import gc
import pickle
import socket
from multiprocessing.reduction import ForkingPickler

import pytest

from engram_sync.relay.services.config import RelayConfig
from engram_sync.relay.serving import server as serving
from engram_sync.relay.serving.app import create_app

linux_only = pytest.mark.skipif(
    not serving._PER_WORKER_SOCKETS, reason="per-worker sockets are Linux-only"
)


def _is_listening(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))


@linux_only
def test_a_worker_unpickles_a_socket_of_its_own_on_the_same_address() -> None:
    parent = serving._worker_listener("127.0.0.1", 0)
    try:
        # uvicorn hands sockets to spawned workers with multiprocessing's pickler
        first = pickle.loads(bytes(ForkingPickler.dumps([parent])))[0]
        second = pickle.loads(bytes(ForkingPickler.dumps([parent])))[0]
        try:
            assert first.getsockname() == second.getsockname() == parent.getsockname()
            assert len({parent.fileno(), first.fileno(), second.fileno()}) == 3
            for sock in (first, second):
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
                sock.listen()
            assert not _is_listening(parent)  # no connection ever queues on the parent's
            assert _is_listening(first)
            assert _is_listening(second)
        finally:
            first.close()
            second.close()
    finally:
        parent.close()


@linux_only
def test_the_kernel_spreads_connections_over_the_workers_sockets() -> None:
    parent = serving._worker_listener("127.0.0.1", 0)
    workers = [pickle.loads(bytes(ForkingPickler.dumps([parent])))[0] for _ in range(2)]
    clients: list[socket.socket] = []
    try:
        for sock in workers:
            sock.listen()
            sock.setblocking(False)
        clients = [socket.create_connection(parent.getsockname()[:2]) for _ in range(32)]
        accepted = []
        for sock in workers:
            count = 0
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                conn.close()
                count += 1
            accepted.append(count)
        assert sum(accepted) == 32
        assert min(accepted) > 0  # 2**-31 odds that a fair hash gives one socket all 32
    finally:
        for sock in [*clients, *workers, parent]:
            sock.close()


@linux_only
def test_a_taken_port_fails_in_the_supervisor() -> None:
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(OSError):
            serving._worker_listener("127.0.0.1", taken.getsockname()[1])
    finally:
        taken.close()


def test_settling_the_app_freezes_the_heap_built_so_far() -> None:
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    app = create_app(RelayConfig(database_url="postgresql://unused@127.0.0.1:1/none"))
    try:
        assert serving._settled(app) is app
        assert gc.get_freeze_count() > 10_000  # modules, routes and the app itself
    finally:
        gc.unfreeze()
