"""The Ray backend of run_sweep(): one Ray task per (run, prompt shard).

What travels: the driver sends each task its run (a source string: a hub id, "zoo:NAME" or a
path that every node can read) and its shard's prompts (strings or token ids, a few KB); the
task returns the shard's table (Arrow, through Ray's object store) and metadata; the driver
writes the Parquet file atomically as each task finishes, so workers need no shared
filesystem for the output. A worker process keeps the model it loaded last
(sweep/worker.py: cached_model) and tasks are submitted run by run, so each worker loads a
model about once per run. With ``device="cuda..."`` each task asks Ray for ``num_gpus``
GPUs (default 1; a fraction packs several workers on one GPU) and Ray pins it to them.

``address`` joins a running cluster (``ray.init(address=...)``, e.g. "auto"); without it and
with Ray not yet initialised, ``ray.init(**init)`` starts a local one (shut down at the end).
"""

from __future__ import annotations

from .inputs import Run
from .worker import cached_model, compute_shard

__all__ = ["run_ray", "shard_task", "check_address", "CONNECT_TIMEOUT"]

CONNECT_TIMEOUT = 10.0  # seconds to reach a cluster's address before giving up


def shard_task(run: dict, items: list, options: dict, device):
    """Body of one Ray task (also callable in-process): (table, meta) of one shard."""
    run = Run(**run)
    model, tokenizer = cached_model(run.source, device)
    table, meta = compute_shard(run, model, tokenizer, items, options)
    return table, meta


def check_address(address) -> None:
    """ValueError when ``address`` ("host:port", "ray://host:port") accepts no connection
    within CONNECT_TIMEOUT seconds: ray.init would otherwise wait without end. "auto" and
    None are left to Ray (a local cluster, or the one this machine runs)."""
    import socket

    if address is None or address == "auto":
        return
    if not isinstance(address, str):
        raise ValueError(f"ray_address must be a string such as 'auto' or 'host:6379', got {address!r}")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"ray_address must be 'auto' or 'host:port' (e.g. 127.0.0.1:6379), got {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except (OSError, OverflowError) as error:
        raise ValueError(
            f"no Ray cluster answers at {address} within {CONNECT_TIMEOUT:g} s ({error}); start one "
            "(`ray start --head`), check the address, or leave --ray-address out for a local cluster"
        ) from None


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError("backend='ray' needs Ray: pip install 'ess-explorer[ray]' (or use backend='local')") from None
    return ray


def run_ray(pending, prompts: list, options: dict, *, device=None, address=None, init=None, num_gpus=None, finish):
    """Compute every shard of ``pending`` as a Ray task; ``finish(shard, table, meta)`` is
    called on the driver as each one completes (in completion order)."""
    if not pending:
        return
    ray = _import_ray()
    started = False
    if not ray.is_initialized():
        kwargs = {"include_dashboard": False, **(init or {})}
        if address is not None:
            kwargs["address"] = address
        ray.init(**kwargs)
        started = True
    gpus = num_gpus if num_gpus is not None else (1 if device is not None and str(device).startswith("cuda") else 0)
    task = ray.remote(shard_task).options(num_cpus=1, num_gpus=gpus, max_retries=2)
    try:
        refs = {}
        for shard in pending:  # in plan order: run by run, so a worker keeps one model loaded
            items = [(i, prompts[i]) for i in shard.prompt_ids]
            refs[task.remote(shard.run.to_dict(), items, options, device)] = shard
        while refs:
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                table, meta = ray.get(ref)
                finish(refs.pop(ref), table, meta)
    finally:
        if started:
            ray.shutdown()
