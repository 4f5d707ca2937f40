"""Several learner processes as one jax.distributed job over one global device mesh.

Every process runs the same loop (learner/loop.py) with its own actors, replay and sockets. Whatever
touches the devices they do together, in the same order: each loop iteration `agree` all-gathers two
flags (ready to train, stop wanted), so all processes call the same compiled step the same number of
times; each contributes its rows of the global batch (`global_batch`), and the collectives XLA puts
inside the step (the gradient all-reduce over 'data') combine them. Parameters stay identical on every
process, so each publishes the same snapshot to its own actors.

A single process takes the same code path: agreement is trivial and its rows are the whole batch.
CPU processes talk through gloo, GPUs through NCCL, TPUs through ICI/DCN (jax chooses).
"""

from __future__ import annotations

import itertools
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding


def initialize(coordinator: str | None, num_processes: int, process_id: int) -> None:
    """Join the jax.distributed job (must run before anything touches a JAX device); no-op for 1 process.
    The arguments are checked by learner.config.MultihostConfig.

    JAX's preemption service is turned off: it takes SIGTERM for itself (a C++ handler that only marks a
    sync point), so the learner's own handler (learner/loop.py: agree on the stop, a final checkpoint)
    never ran and a SIGTERM'd multi-process learner trained on until it was killed (found by the
    two-process chaos soak; tests/test_multihost.py stops its second pair with SIGTERM)."""
    if num_processes == 1:
        return
    jax.config.update("jax_enable_preemption_service", False)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU-only runs need a collective backend
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)


def agree(ready: bool, stop: bool) -> tuple[bool, bool]:
    """(every process is ready to train, some process wants to stop): one all-gather of two flags."""
    if jax.process_count() == 1:
        return ready, stop
    flags = np.asarray(multihost_utils.process_allgather(np.array([ready, stop], np.int32)))
    return bool(flags[:, 0].all()), bool(flags[:, 1].any())


def local_rows(sharding: NamedSharding, global_size: int) -> slice:
    """The rows of a [global_size, ...] batch that this process's devices hold under `sharding` (its share
    of every batch; priorities computed for the whole batch are read back at these rows).

    Refuses layouts where processes would hold the same rows (the 'data' axis must span the processes).
    """
    rows = (index[0] for index in sharding.addressable_devices_indices_map((global_size,)).values())
    spans = sorted({(r.start or 0, global_size if r.stop is None else r.stop) for r in rows})
    lo, hi = spans[0][0], spans[-1][1]
    contiguous = all(stop == start for (_, stop), (start, _) in itertools.pairwise(spans))
    if not contiguous or (hi - lo) * jax.process_count() != global_size:
        raise SystemExit(
            f"with {jax.process_count()} learner processes each must hold its own rows of the batch: make the "
            f"mesh's 'data' axis a multiple of the process count (here: rows {lo}:{hi} of {global_size})"
        )
    return slice(lo, hi)


def global_batch(local: Any, sharding: NamedSharding, global_size: int) -> Any:
    """This process's rows (a host Batch or any tree of arrays) -> the same tree of global jax.Arrays of
    [global_size, ...], split per `sharding`."""
    return jax.tree.map(
        lambda x: jax.make_array_from_process_local_data(sharding, x, (global_size, *np.shape(x)[1:])), local
    )


def place(host_tree: Any, shardings: Any) -> Any:
    """Host arrays that are equal on every process -> global arrays laid out per `shardings` (each process
    fills only its own devices' shards, so no process needs the whole array on one device)."""

    def one(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    return jax.tree.map(one, host_tree, shardings)


def host_copy(tree: Any) -> Any:
    """Global arrays -> whole host arrays on every process (a collective when shards live elsewhere)."""
    if all(x.is_fully_addressable for x in jax.tree.leaves(tree)):
        return tree
    return multihost_utils.process_allgather(tree, tiled=True)
