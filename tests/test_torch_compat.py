"""runtime/torch_compat.py: the older torch's names where a newer one is missing, and a process
group's end that cannot hang on torch 2.6. (The collectives themselves are checked against each
other on real ranks in tests/test_sharding.py and tests/test_shared_memory.py, which call them
through this module; .ci/test_oldest_torch.sh runs the suite's core on torch 2.6.)"""
from types import SimpleNamespace

import torch.distributed as dist

from runtime import torch_compat


def test_the_newer_name_is_taken_where_torch_has_it_else_the_older():
    def newer():
        """A newer name."""

    def older():
        """An older name."""

    assert torch_compat.either(SimpleNamespace(new=newer, old=older), "new", "old") is newer
    assert torch_compat.either(SimpleNamespace(old=older), "new", "old") is older


def test_the_collectives_are_looked_up_at_each_call_where_a_watch_sees_them(monkeypatch):
    calls = []
    monkeypatch.setattr(dist, "all_gather_single", lambda *args: calls.append(args),
                        raising=False)
    torch_compat.all_gather_single("output", "shard")
    assert calls == [("output", "shard")]


def test_without_process_group_shutdown_the_group_is_kept_alive_then_destroyed(monkeypatch):
    destroyed = []
    world = object()
    older_torch = SimpleNamespace(ProcessGroup=type("ProcessGroup", (), {}),
                                  group=SimpleNamespace(WORLD=world),
                                  destroy_process_group=lambda: destroyed.append(True))
    monkeypatch.setattr(torch_compat, "dist", older_torch)
    monkeypatch.setattr(torch_compat, "_KEPT_ALIVE", [])
    torch_compat.destroy_process_group()
    # its destructor, which would join gloo's threads holding the GIL, never runs
    assert torch_compat._KEPT_ALIVE == [world] and destroyed == [True]


def test_with_process_group_shutdown_nothing_is_kept(monkeypatch):
    newer_torch = SimpleNamespace(ProcessGroup=type("ProcessGroup", (), {"shutdown": None}),
                                  group=SimpleNamespace(WORLD=object()),
                                  destroy_process_group=lambda: None)
    monkeypatch.setattr(torch_compat, "dist", newer_torch)
    monkeypatch.setattr(torch_compat, "_KEPT_ALIVE", [])
    torch_compat.destroy_process_group()
    assert torch_compat._KEPT_ALIVE == []
