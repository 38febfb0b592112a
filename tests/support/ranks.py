"""One rank of a CPU-only torchrun-like run (gloo), for tests/client/test_group.py: started by multiprocessing's spawn,
so it lives in an importable module. Each step is a little compute and an all-reduce, as a data-parallel step is."""

from __future__ import annotations

import os
from datetime import timedelta

from tests.support.daemon import FEATURES

MAX_STEPS = 5000


def run_rank(rank: int, world_size: int, local_world_size: int, port: int, socket: str, results, release,
             speeds: list[float] | None = None) -> None:
    """Train until the group's tuning is done, report (rank, the coordinator's figures, the level), then hold the job
    until ``release`` is set (the test kills a rank meanwhile), and end. With ``speeds``: each rank's compute takes
    longer the lower its GPU's level and the slower its simulated GPU (``speeds[rank]``), and it calls
    ``job.compute_done()`` before the all-reduce, so that rank 0 trims the ranks that wait."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(rank % local_world_size), LOCAL_WORLD_SIZE=str(local_world_size),
                      TORCHELASTIC_RUN_ID="test-run")
    import torch
    import torch.distributed as dist

    import governor

    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    a = torch.rand(128, 128)
    grad = torch.ones(256)
    job = governor.job(**FEATURES, tune=True, gpu=rank % local_world_size, socket=socket)
    with job:
        for _ in range(MAX_STEPS):
            a = torch.tanh(a @ a)
            if speeds is not None:
                levels = job.registration["levels_hz"]
                own = job.coordinator.own_hz if job.coordinator is not None else None
                work = max(levels) / (own or max(levels)) / speeds[rank]
                for _ in range(round(8 * work)):
                    a = torch.tanh(a @ a)
                job.compute_done()
            dist.all_reduce(grad)
            job.step()
            if job.coordinator is not None and job.coordinator.done:
                break
        coordinator = job.coordinator.describe() if job.coordinator is not None else None
        results.put((rank, os.getpid(), job.steps, coordinator))
        release.poll(180)  # the test's word (a pipe each: a killed waiter cannot wedge it, as it can an Event)
    results.put((rank, "ended", job.result))
    results.close()
    results.join_thread()  # os._exit skips the queue's flush at exit
    # A peer was killed: tearing down the process group could wait on it. The job has ended already.
    os._exit(0)


def _launched(env: dict[str, str]) -> None:
    """This process's environment as a launcher that sets no group key gives it: ``env`` on 127.0.0.1, and no
    RANK unless ``env`` has one, no TORCHELASTIC_RUN_ID, no Slurm step."""
    os.environ.update(MASTER_ADDR="127.0.0.1", **env)
    for name in ("RANK", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID"):
        if name not in env:
            os.environ.pop(name, None)


def _report(results, rank: int, job) -> None:
    """(rank, the job's group key, its rank and world size, whether it registered)."""
    info = job.group_info
    results.put((rank, info.key if info else None, info.rank if info else None, info.world_size if info else None,
                 job.registration is not None))


def lightning_rank(rank: int, world_size: int, port: int, socket: str, results) -> None:
    """A rank as Lightning's own DDP launcher starts one (LOCAL_RANK, NODE_RANK and WORLD_SIZE in the environment; no
    RANK, no TORCHELASTIC_RUN_ID): the process group up over gloo, then GovernorCallback's train-start hook, as every
    rank runs it. Reports (rank, the job's group, its rank and world size) and ends the job."""
    _launched({"MASTER_PORT": str(port), "LOCAL_RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size)})
    import torch
    import torch.distributed as dist

    from governor.lightning import GovernorCallback

    class Trainer:  # what the hook reads of a Lightning Trainer
        global_rank, global_step, max_steps, estimated_stepping_batches = rank, 0, 10, 10

    Trainer.world_size = world_size
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    callback = GovernorCallback(**FEATURES, gpu=rank, socket=socket)
    callback.on_train_start(Trainer(), torch.nn.Linear(2, 2))
    _report(results, rank, callback.job)
    dist.barrier()  # both registered before either ends
    callback.close()
    dist.destroy_process_group()


def hf_rank(rank: int, world_size: int, port: int, socket: str, results, holders: tuple[int, ...] | None = None,
            runs: int = 1, env: dict[str, str] | None = None, tune: bool | None = None) -> None:
    """A rank as deepspeed's launcher starts one (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE,
    MASTER_ADDR and MASTER_PORT in the environment; no TORCHELASTIC_RUN_ID, no Slurm step): a Hugging Face Trainer,
    whose TrainingArguments bring the process group up (gloo, on the CPU), trains a tiny model for two steps under
    GovernorCallback, DDP's all-reduce keeping both ranks registered until each has stepped; ``runs`` times, a new
    Trainer and callback each (a notebook's cells). Only the ranks in ``holders`` (all: None) hold the callback (with
    ``tune``); ``env``: more of the launcher's environment.
    Reports as lightning_rank does after each run (a rank without the callback: no group, not registered), then
    (rank, "warned", the warnings it gave)."""
    _launched({"MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
               "LOCAL_SIZE": str(world_size), "CROSS_RANK": "0", "CROSS_SIZE": "1", **(env or {})})
    import tempfile
    import warnings

    import torch
    from transformers import Trainer, TrainingArguments

    from governor.hf import GovernorCallback

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x, labels):
            return {"loss": torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), labels)}

    data = [{"x": torch.ones(2) * i, "labels": torch.tensor(float(i))} for i in range(8)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(runs):
            held = holders is None or rank in holders
            callbacks = [GovernorCallback(**FEATURES, gpu=rank, socket=socket, tune=tune)] if held else []
            with tempfile.TemporaryDirectory() as out:
                args = TrainingArguments(output_dir=out, max_steps=2, per_device_train_batch_size=2, use_cpu=True,
                                         ddp_backend="gloo", report_to=[], save_strategy="no", logging_strategy="no",
                                         disable_tqdm=True)
                Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=callbacks).train()
            if held:
                _report(results, rank, callbacks[0].job)
            else:
                results.put((rank, None, None, None, False))
    results.put((rank, "warned", [str(w.message) for w in caught if "ftgov" in str(w.message)]))


def hf_rank_without_process_group(rank: int, world_size: int, port: int, socket: str, results,
                                  group: str | None = None) -> None:
    """A rank of a Trainer whose ranks share no torch.distributed process group (under torch_xla, accelerate counts the
    processes without one: args.world_size is theirs), started by a launcher that sets RANK and WORLD_SIZE but no group
    key: GovernorCallback(group=group)'s train begin twice (a second train() on the same model carries the job on), as
    every rank runs it. Reports as lightning_rank does, with the warnings it gave."""
    _launched({"MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)})
    import warnings

    import torch
    from transformers import TrainerControl, TrainerState

    from governor.hf import GovernorCallback

    class Args:  # what the hook reads of TrainingArguments when the ranks' group is not torch.distributed's
        process_index, run_name = rank, None

    Args.world_size = world_size
    model = torch.nn.Linear(2, 2)
    callback = GovernorCallback(**FEATURES, gpu=rank, socket=socket, group=group)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(2):
            callback.on_train_begin(Args(), TrainerState(max_steps=10), TrainerControl(), model=model)
    results.put((rank, "warned", [str(w.message) for w in caught]))
    _report(results, rank, callback.job)
    callback.close()


def lightning_trainer_rank(rank: int, world_size: int, port: int, socket: str, results,
                           holders: tuple[int, ...] | None = None) -> None:
    """A rank as Lightning's own DDP launcher starts one (as lightning_rank): a real Lightning Trainer (strategy ddp
    over gloo, on the CPU) fits a tiny model for two steps, DDP's all-reduce keeping the ranks in step; only the ranks
    in ``holders`` (all: None) hold a GovernorCallback. Reports as hf_rank does."""
    _launched({"MASTER_PORT": str(port), "LOCAL_RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size)})
    import warnings

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import DDPStrategy

    from governor.lightning import GovernorCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.linear(x).squeeze(-1), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.ones(8, 2), torch.ones(8))
    held = holders is None or rank in holders
    callbacks = [GovernorCallback(**FEATURES, gpu=rank, socket=socket)] if held else []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pl.Trainer(max_steps=2, accelerator="cpu", devices=world_size, num_nodes=1,
                   strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)), logger=False,
                   enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                   callbacks=callbacks).fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
    if held:
        _report(results, rank, callbacks[0].job)
    else:
        results.put((rank, None, None, None, False))
    results.put((rank, "warned", [str(w.message) for w in caught if "ftgov" in str(w.message)]))


class _GatedStore:
    """The process group's store, as shared_run_key sees it, with gates that order the ranks through the store, never
    by time: ``(start, method, pattern, mark, after)``: before this rank's first call of ``method`` on a key matching
    ``pattern`` at train start ``start`` (``self.start``), it sets the key ``mark`` and waits for the key ``after``
    (another rank's mark), either of them None for none."""

    def __init__(self, store, gates: list[tuple]):
        self.store, self.gates, self.start = store, list(gates), 0

    def __getattr__(self, method: str):
        import re

        call = getattr(self.store, method)

        def gated(keys, *args):
            for gate in list(self.gates):
                start, name, pattern, mark, after = gate
                if (start, name) == (self.start, method) and any(
                        re.search(pattern, key) for key in (keys if isinstance(keys, list) else [keys])):
                    self.gates.remove(gate)
                    if mark is not None:
                        self.store.set(mark, "1")
                    if after is not None:
                        self.store.wait([after], timedelta(seconds=60))
            return call(keys, *args)
        return gated


def agreeing_rank(rank: int, world_size: int, port: int, socket: str | None, results, starts: list[tuple[int, ...]],
                  gates: dict[int, list[tuple]] | None = None, unsynced: tuple[int, ...] = ()) -> None:
    """A rank whose process group is up (gloo) runs the callbacks' agreement at train start (shared_run_key) at each of
    ``starts`` that holds it (the ranks whose Trainer has a callback at that start; the others skip it), then a barrier
    (none after the starts in ``unsynced``), as a notebook's cells each train a Trainer under DDP, which keeps the
    ranks in step. At a start that some rank skips, the agreement's waits are short (0.5 s): their ending is all that
    start waits for. ``gates``: this rank's, by rank (_GatedStore). Reports (rank, the start, the key it agreed on;
    None: it skipped that start) for each start."""
    _launched({"MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world_size)})
    import torch.distributed as dist

    from governor.client import group

    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=120))
    store = _GatedStore(dist.distributed_c10d._get_default_store(), (gates or {}).get(rank, []))
    dist.distributed_c10d._get_default_store = lambda: store
    waits = group.ANNOUNCE_WAIT_S, group.DECISION_WAIT_S
    for start, holders in enumerate(starts):
        store.start = start
        group.ANNOUNCE_WAIT_S, group.DECISION_WAIT_S = waits if len(holders) == world_size else (0.5, 0.5)
        results.put((rank, start, group.shared_run_key("hf", None) if rank in holders else None))
        if start not in unsynced:
            dist.barrier()
    dist.destroy_process_group()
