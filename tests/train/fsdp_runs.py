"""Training runs for tests/train/test_train_fsdp.py, run by every rank of a torchrun group:
``python -m torch.distributed.run --nproc_per_node 2 fsdp_runs.py JOBS.json``. Each job is a
TrainConfig mapping, run one after another in the same process group (one launch for all of
them keeps the test short); a job with ``"resume": true`` continues the run in its ``out``.
Rank 0 writes each run's summary to ``JOBS.json.out``."""

import json
import sys

import torch.distributed as dist

from sparsetool.train.loop import Trainer
from sparsetool.train.trainconfig import TrainConfig, validate


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.loads(f.read())
    summaries = {}
    for job in jobs:
        resume = bool(job.pop("resume", False))
        cfg = validate(TrainConfig.from_dict(job))
        trainer = Trainer(cfg, resume=resume)
        summaries[job["out"] + (" resumed" if resume else "")] = trainer.run()
    if dist.get_rank() == 0:
        with open(sys.argv[1] + ".out", "w") as f:
            json.dump(summaries, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
