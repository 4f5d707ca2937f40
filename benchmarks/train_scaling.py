"""The sharded train step (learner.training.mesh) per device count and mesh layout.

For each device count D (1, 2, 4, 8; quick: 1 and 8) a worker subprocess starts with
`XLA_FLAGS=--xla_force_host_platform_device_count=D JAX_PLATFORMS=cpu` (the device count must be set
before jax initializes) and prints one JSON line of rows. Each worker times the learner's step (default
ModelConfig, make_optimizer(1e-3, 1.0), A-RIDE's loss with LossParams()) on a global batch of 32 episodes x up to 12 steps
(featurized stand-in screens of varied lengths, collated with replay weights) on a mesh data=D, model=1
with replicated parameters, and for D >= 2 also on data=D/2, model=2 with "fsdp" parameters. When not
quick, a D=1 worker also times the ~134M-parameter large preset on a small batch (4 episodes x <= 4 steps).

FLOPs come from the compiled step's cost_analysis. For an SPMD-partitioned executable XLA analyses the
per-device program, so its count is per device; the total per step is that times the mesh's devices
(replicated work, such as the optimizer update of replicated parameters, is counted once per device,
because every device does it). Achieved GFLOP/s = total FLOPs per step / step time. The reference is a
jitted matmul chain of the model's width measured in the same worker on one device (as learner_step).
Utilization = achieved / peak, where peak = the reference times the number of independent compute
units: 1 on CPU (the forced host devices all share the machine's cores, and one device's matmul already
uses all of them), D on real accelerators.

On a CPU-only machine the forced devices share the same physical cores, so the rows measure the cost of
sharding (partitioning, collectives, more and smaller kernels, thread oversubscription), not a speed-up.
On a machine with D real devices the same command measures scaling: a JAX_PLATFORMS the caller set
(e.g. `JAX_PLATFORMS=cuda python -m benchmarks train_scaling`) is passed on instead of cpu, each worker
takes the first D devices, and counts beyond the devices present are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from benchmarks.report import best_seconds, matmul_gflops

BATCH, MAX_STEPS = 32, 12
LARGE_BATCH, LARGE_STEPS = 4, 4
WORKER_TIMEOUT_S = 600


# ---- the parent: one subprocess per device count --------------------------------------------------------


def worker_env(devices: int) -> dict[str, str]:
    """The environment of a worker with `devices` forced host devices (other XLA flags are kept).

    JAX_PLATFORMS defaults to cpu; one the caller set (e.g. cuda) is kept, and the worker then uses the
    first `devices` real devices (the host-device flag only affects the CPU platform)."""
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={devices}")
    return {"JAX_PLATFORMS": "cpu", **os.environ, "XLA_FLAGS": " ".join(flags)}


def run_worker(devices: int, quick: bool, large: bool = False) -> list[dict]:
    cmd = [sys.executable, "-m", "benchmarks.train_scaling", "--worker", "--devices", str(devices)]
    cmd += ["--quick"] if quick else []
    cmd += ["--large"] if large else []
    proc = subprocess.run(
        cmd, env=worker_env(devices), capture_output=True, text=True, timeout=WORKER_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise RuntimeError(f"train_scaling worker ({devices} devices) failed:\n{proc.stderr[-5000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(quick: bool) -> list[dict]:
    rows = []
    for devices in (1, 8) if quick else (1, 2, 4, 8):
        rows += run_worker(devices, quick)  # [] when a real platform has fewer devices
    # Step time of the one-device row over this row's (> 1: faster). Forced host devices share the
    # cores, so here this measures overhead; on D real devices, scaling.
    base = next(r["ms_per_step"] for r in rows if r["devices"] == 1)
    rows = [{**r, "speedup_vs_1": base / r["ms_per_step"]} for r in rows]
    if not quick:
        rows += run_worker(1, quick, large=True)
    return rows


# ---- the worker ------------------------------------------------------------------------------------------


def make_batch(cfg, count: int, max_steps: int, seed: int = 0) -> dict:
    """collate() of `count` stand-in episodes with lengths spread over [max_steps // 3, max_steps] (the
    short ones ended in success) and replay importance weights in [0.5, 1.5)."""
    from benchmarks import data
    from common import protocol
    from learner.batch import collate

    rng = np.random.default_rng(seed)
    episodes = []
    for ep in data.episodes(cfg, count, max_steps):
        n = int(rng.integers(max(1, max_steps // 3), max_steps + 1))
        steps = {k: np.array(v[:n]) for k, v in ep.steps.items()}
        success = n < max_steps
        steps["reward"][-1] = 1.0 if success else 0.0
        obs = {k: v[: n + 1] for k, v in ep.obs.items()}
        episodes.append(protocol.Episode(ep.task, success, not success, obs, steps))
    weights = rng.uniform(0.5, 1.5, count).astype(np.float32)
    return collate(episodes, max_steps, weights)


def time_layout(cfg, devices, data_axis: int, model_axis: int, sharding: str, batch: dict, repeats, inner):
    """One row: the sharded step on a data_axis x model_axis mesh over `devices`."""
    import jax

    from common.policies import make_policy
    from common.policies.pointer import sizes
    from learner.losses import LOSSES, LossParams
    from learner.training import mesh as M
    from learner.training import sharding as S
    from learner.training.sharded_step import make_sharded_train_step
    from learner.training.train_step import make_optimizer

    mesh = M.make_mesh(M.MeshConfig(data=data_axis, model=model_axis, param_sharding=sharding), devices)
    optimizer = make_optimizer(1e-3, 1.0)
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    n_params = sizes.count_params(params)
    specs = S.param_specs(params, mesh, sharding)
    params = S.shard_params(params, mesh, specs)
    opt_state = S.init_opt_state(optimizer, params, mesh, specs)
    loss = LOSSES["aride"].rl
    step = make_sharded_train_step(graphdef, optimizer, loss, LossParams(), policy.evaluate, mesh, specs)
    placed = S.shard_batch(batch, mesh)

    t0 = time.perf_counter()
    compiled = step.lower(params, opt_state, placed).compile()
    compile_s = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    flops_per_device = float(cost.get("flops", 0.0))
    state = [params, opt_state]

    def one_update():
        state[0], state[1], metrics, _ = compiled(state[0], state[1], placed)
        jax.block_until_ready(metrics)
        return metrics

    t0 = time.perf_counter()
    metrics = one_update()  # warm-up: first execution (allocations, thread pools)
    first_s = time.perf_counter() - t0
    step_s = best_seconds(one_update, repeats, inner)
    devices = data_axis * model_axis
    episodes = int(batch.length.shape[0])
    return {
        "devices": devices,
        "mesh": f"{data_axis}x{model_axis}",
        "param_sharding": sharding,
        "params": n_params,
        "batch": f"{episodes} eps x {int(batch.length.max())} steps",
        "ms_per_step": step_s * 1e3,
        "traj_per_s": episodes / step_s,
        "env_steps_per_s": int(batch.length.sum()) / step_s,
        "gflop_per_device": flops_per_device / 1e9,
        "gflop_per_step": flops_per_device * devices / 1e9,
        "compile_s": compile_s,
        "first_step_s": first_s,
        "loss_finite": bool(np.isfinite(float(metrics["loss"]))),
    }


def worker(devices: int, quick: bool, large: bool) -> list[dict]:
    import jax

    from common.config import ModelConfig
    from common.policies.pointer.sizes import large_model_config

    load_1m = os.getloadavg()[0]  # other processes loading the CPU when the worker started
    found = jax.devices()
    cpu = found[0].platform == "cpu"
    if cpu and len(found) != devices:  # the forced host devices: exactly as many as asked for
        raise RuntimeError(f"expected {devices} host devices, jax sees {len(found)}: {found}")
    if len(found) < devices:  # a real platform with fewer devices: no rows for this count
        print(
            f"train_scaling: skipping {devices} devices, {found[0].platform} has {len(found)}",
            file=sys.stderr,
        )
        return []
    found = found[:devices]
    repeats, inner = (2, 1) if quick else (5, 2)
    if large:
        cfg = large_model_config()
        layouts = [(1, 1, "replicated")]
        batch = make_batch(cfg, LARGE_BATCH, LARGE_STEPS)
        repeats, inner = 2, 1
    else:
        cfg = ModelConfig()
        layouts = [(devices, 1, "replicated")] + ([(devices // 2, 2, "fsdp")] if devices >= 2 else [])
        batch = make_batch(cfg, BATCH, MAX_STEPS)
    rows = [time_layout(cfg, found, d, m, s, batch, repeats, inner) for d, m, s in layouts]
    ref = matmul_gflops(cfg.d_model, 3 if quick else 5)
    # Forced host devices share the CPU's cores (one device's matmul already uses all of them): the peak
    # is the one-device reference. Real accelerators each have their own: the peak is D references.
    units = 1 if cpu else devices
    out = []
    for row in rows:
        achieved = row["gflop_per_step"] / (row["ms_per_step"] / 1e3)
        out.append(
            {
                "model": "large" if large else "default",
                **row,
                "achieved_gflops": achieved,
                "ref_matmul_gflops": ref,
                "peak_gflops": ref * units,
                "utilization": achieved / (ref * units),
                "load_1m": load_1m,
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description="one train_scaling worker (run by `python -m benchmarks`)")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--large", action="store_true", help="the large preset on one device, small batch")
    args = parser.parse_args()
    print(json.dumps(worker(args.devices, args.quick, args.large)))


if __name__ == "__main__":
    main()
