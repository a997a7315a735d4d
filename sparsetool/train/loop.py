"""The training loop: AdamW, warm-up + cosine LR, clipping, accumulation, sparsity, DDP, resume.

One optimizer step (the order the sparsity library expects)::

    for each micro-batch: loss.backward()         # DDP all-reduces on the last one
    sparsifier.before_step(step)                  # updates masks when due (RigL reads the
                                                  # gradients), then masks the gradients
    clip the global gradient norm                 # so over kept weights only
    optimizer.step()                              # AdamW
    sparsifier.after_step(step)                   # re-masks weights (pruned ones back to 0)

Runs under ``torchrun --nproc_per_node N``: every rank builds the same model from the same seed,
reads its slice of the same global batch, and the sparsifier takes mask decisions from
all-reduced scores and a shared (seed, step) generator, then broadcasts them as a safety net.

With ``stop_on_signal`` (the command line) the first SIGINT/SIGTERM ends the run after the step in
progress, with a checkpoint at it (:mod:`.signals`); every rank stops after the same step. A second
one stops at once: during the computation of a step or an evaluation (``StopRequest.at_once``) it
ends the process there, even inside a backward pass, with nothing written.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist

from sparsetool.checkpoint.encodings import loader_warning
from sparsetool.checkpoint.output_files import (
    ResultDict,
    check_writable,
    reclaiming,
    write_error,
)
from sparsetool.errors import ConfigError
from sparsetool.models.gpt import GPT, GPTConfig
from sparsetool.targets import plan_targets
from sparsetool.train import diskplan, distill, hfrun, runfiles, runstate, warmstart
from sparsetool.train.data import Sampler, eval_batches
from sparsetool.train.distributed import (
    gather_digests,
    gather_mask_digests,
    setup_runtime,
    wrap_ddp,
)
from sparsetool.train.fsdp import load_slices, parameters_on_meta, shard_model
from sparsetool.train.memplan import check_plan, run_plan
from sparsetool.train.recipe import (
    Stage,
    lr_at,
    model_config,
    param_groups,
    sparsifier_config,
    stage_plan,
)
from sparsetool.train.sharding import gathered
from sparsetool.train.signals import SIGNALS, StopRequest, signal_name
from sparsetool.train.trainconfig import TrainConfig
from sparsetool.util.corpus import load_corpus
from sparsetool.util.plotting import PLOT_EXTRA

Callback = Callable[[str, dict], None]


class Trainer:
    """Set up from a TrainConfig; :meth:`run` trains and returns the summary.

    What :mod:`.runstate` reads to restore and save a checkpoint, write run.json and make the
    summary is public and typed there (:class:`~sparsetool.train.runstate.TrainerView`): the
    settings (``cfg``, ``run_dir``, ``model_cfg``, ``hf``, ``corpus_info``), the parts (``model``,
    ``optimizer``, ``targets``, ``log``), the sparsity state below, the processes (``world``,
    ``master``, ``sharded``) and the derived :meth:`sparsity`, :attr:`num_params` and
    :meth:`rank_mask_digests`. Where the run stands (step, data position, tokens, stage, losses)
    is a :class:`~sparsetool.train.runstate.RunState`, advanced by :meth:`_train_step`."""

    def __init__(
        self,
        cfg: TrainConfig,
        resume: bool = False,
        callback: Callback | None = None,
        flag_overrides: dict | None = None,
    ) -> None:
        self.callback = callback or (lambda kind, info: None)
        self.run_dir = Path(cfg.out)
        self.resume_from: Path | None = None
        self._resumed_model: dict | None = None
        # The sparsity state, all declared here: ``sparsifier`` is set when the run and each stage
        # start (_start_run, _enter_stage), the rest where a sparsifier is built or the ranks' masks
        # checked.
        # checked.
        self.sparsifier = None  # the stage's sparsifier, None while dense
        self.sparsifier_config: dict | None = (
            None  # the mapping it was built from (resumes rebuild it)
        )
        self.resolved_settings: dict[int, dict] = {}  # stage (1-based) -> resolved sparse settings
        self.mask_divergences = 0  # mask updates after which the ranks' masks differed (DDP)
        self._sparsifier_generation = (
            0  # one more for each sparsifier built: the cached sparsity is stale
        )
        self._sparsity_cache: tuple[tuple[int, int], float] | None = (
            None  # (generation, updates), sparsity
        )
        self.log = runstate.NullLog()  # the run's log.jsonl on rank 0, from the start of the run
        self.stop_request = StopRequest(enabled=False)  # the signal handlers while run() runs
        self.step_in_progress = 0  # 0-based: the step a second signal names
        self.disk_plan: diskplan.DiskPlan | None = None  # made when the run starts
        self.init_note: str | None = None  # why --init's zero weights are not masks (dense)
        self.plots = runfiles.can_plot()  # loss.png needs matplotlib; without it, a note
        if resume:
            cfg, self._resumed_model, self.resume_from = runstate.resumed_config(
                self.run_dir, flag_overrides or {}
            )
        else:
            runstate.check_new_run(self.run_dir)
        check_writable(self.run_dir, "-o", directory=True)  # before the model and data are read
        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(int(cfg.threads))
        self.world, self.sharded = 1, False  # until the processes are set up
        try:
            self._setup_distributed()
            self._setup_model_and_data()
        except BaseException:
            self.close()  # a refused or failed setup leaves no process group behind
            raise

    # ------------------------------------------------------------------ setup
    def _setup_distributed(self) -> None:
        rt = setup_runtime(self.cfg.device, self.cfg.dtype, self.cfg.distributed, self.cfg.offload)
        self.world, self.rank, self.device = rt.world, rt.rank, rt.device
        self.autocast, self.precision = rt.autocast, rt.precision
        self.sharded, self._bf16_params = rt.sharded, rt.bf16_params
        self.master = self.rank == 0

    def _setup_model_and_data(self) -> None:
        """The model (its shape, weights and targets), the stages, the data and the optimizer."""
        init_weights, init_masks = self._open_model()
        matched, from_slices = self._build_model(init_weights)
        loaded = bool(init_weights)
        del init_weights  # the checkpoint's tensors live on only as ``matched``
        self._plan_targets(matched, init_masks, loaded=loaded)
        if self.sharded:  # from here on each rank holds its slice of every parameter
            shard_model(self.model, self.device, bf16=self._bf16_params, offload=self.cfg.offload)
            if from_slices:  # a resume's slices come from its checkpoint (shardedckpt.restore)
                load_slices(self.model, self.device, matched, offload=self.cfg.offload)
        del matched
        params = dict(self.model.named_parameters())
        self.targets = {n: params[n] for n in self.target_plan.targeted}
        self._plan_stages()
        self._load_data()
        self._make_optimizer()

    def _open_model(self) -> tuple[dict, dict]:
        """The model's shape (``model_cfg``), forward and memory plan: a Hugging Face model
        (--init HF_DIR, or a resume of such a run), else the built-in GPT of the resumed run,
        of --init or of the preset; the (weights, masks) of --init to start from."""
        cfg = self.cfg
        self.hf, self.model_cfg, init_weights, init_masks = hfrun.open_run_model(
            cfg, self.resume_from, self._resumed_model, self.device
        )
        self.forward = lambda model, x, y: model(x, y)  # token ids, targets -> logits, mean loss
        if self.hf:
            self.forward = hfrun.forward
        elif self.resume_from is not None and self._resumed_model:
            # the weights come from the run's own checkpoint; --init is not read again (it may
            # have been moved since)
            self.model_cfg = GPTConfig(**self._resumed_model)
        elif cfg.init:
            warmstart.check_init_is_a_model(cfg.init)
            init_weights, init_masks, init_meta = runfiles.read_init_checkpoint(cfg.init)
            self.model_cfg = warmstart.init_model_config(cfg, init_weights, init_meta)
        else:
            self.model_cfg = model_config(cfg)
        # the validation loss: always the next-token loss (no routers' balancing loss)
        self.lm_forward = hfrun.next_token_forward if self.hf else self.forward
        self.teacher: distill.Teacher | None = None
        if cfg.distill_from:
            if not self.hf:
                raise ConfigError(
                    f"--distill-from {cfg.distill_from}: the student must be a Hugging Face "
                    "directory too (--init STUDENT_DIR), with the teacher's tokenizer"
                )
            self.teacher = distill.Teacher(cfg.distill_from, self.hf.teacher_config, self.device)
            self.forward = distill.distilling(
                self.forward,
                self.teacher,
                cfg.distill_temperature,
                cfg.distill_alpha,
                logits=hfrun.logits_only,
            )
        self.memory_plan = self.hf.plan if self.hf else self._gpt_memory_plan()
        return init_weights, init_masks

    def _build_model(self, init_weights: dict) -> tuple[dict, bool]:
        """The model on its device, seeded alike on every rank, with --init's weights copied in
        unless they are read as slices; (the weights under the model's names, whether each rank
        reads its slices of them after sharding)."""
        torch.manual_seed(self.cfg.seed)  # same initial weights on every rank
        # Sharded weights from a checkpoint (--init, a resume): no process holds the whole model;
        # the parameters are made empty, sharded, then each rank reads its slices (fsdp.py).
        from_slices = self.sharded and (bool(init_weights) or self.resume_from is not None)
        with parameters_on_meta() if from_slices else contextlib.nullcontext():
            self.model = self.hf.build() if self.hf else GPT(self.model_cfg)
        if not self.sharded:  # FSDP moves each rank's slices to the device as it shards
            self.model = self.model.to(self.device)
        matched = self._matched_weights(init_weights, self.cfg.init) if init_weights else {}
        if matched and not from_slices:
            self._copy_in(matched)
        return matched, from_slices

    def _plan_targets(self, matched: dict, init_masks: dict, *, loaded: bool) -> None:
        """Which parameters are pruned (``target_plan``) and the masks of --init over them, from
        the whole weights (before any sharding)."""
        cfg = self.cfg
        params = dict(self.model.named_parameters())
        # One targeting rule for prune and train: roles, or param_filter, then --include/--exclude.
        self.target_plan = plan_targets(
            ((n, tuple(p.shape), p.dtype) for n, p in params.items()),
            None,
            cfg.include,
            cfg.exclude,
            select=cfg.param_filter or None,
            source="the model",
        )
        # the masks of --init, from the whole weights (laid out like them when attached)
        self.init_masks = warmstart.masks_from(
            {n: matched.get(n, params[n]) for n in self.target_plan.targeted},
            init_masks,
            loaded=loaded,
        )
        zeros = ""
        if self.init_masks and not cfg.dense and not any(n in init_masks for n in self.init_masks):
            # masks from zero weights alone: a prune's, or what a conversion left (dense)
            self.init_masks, zeros, self.init_note = warmstart.zero_weight_masks(
                cfg.init,
                self.init_masks,
                asked=warmstart.sparse_training_asked(cfg),
                pruned=warmstart.recorded_prune(cfg.init),
            )
        self.init_mask_origin = warmstart.mask_origin(cfg.init, self.init_masks, init_masks, zeros)

    def _plan_stages(self) -> None:
        """The stages of the run over its steps, checked against --init's masks."""
        self.plan = stage_plan(self.cfg)
        if self.init_masks:
            # --init SPARSE --sparsity S: S below the checkpoint's sparsity would revive weights
            first = self._sparsifier_config(self.plan[0], later_stage=False)
            warmstart.check_init_sparsity(
                (first or {}).get("sparsity"), self.init_masks, self.cfg.init
            )

    def _load_data(self) -> None:
        """The training sampler and the validation batches (a Hugging Face run's tokens)."""
        cfg, context = self.cfg, self.model_cfg.context
        corpus = load_corpus(cfg.data, min_bytes=0 if self.hf else context + 1)
        self.corpus_info = corpus.describe()
        if self.hf:
            corpus, self.corpus_info = self.hf.tokenize(corpus, context)
        self.sampler = Sampler(corpus.train, context, cfg.seed)
        self.val_x, self.val_y = eval_batches(corpus.val, context, cfg.eval_sequences)

    def _make_optimizer(self) -> None:
        """AdamW over the model's parameter groups, and the DDP wrapper of a multi-process run."""
        cfg = self.cfg
        self.optimizer = torch.optim.AdamW(
            param_groups(self.model, cfg.weight_decay),
            lr=cfg.lr,
            betas=(cfg.beta1, cfg.beta2),
            eps=cfg.eps,
            **({"fused": True} if self.device.type == "cuda" else {}),
        )
        self.ddp = (
            wrap_ddp(self.model, self.device) if self.world > 1 and not self.sharded else None
        )

    def _gpt_memory_plan(self):
        """The built-in GPT's memory plan per process (:mod:`.memplan`), refused if it cannot
        fit."""
        with torch.device("meta"):
            params = sum(p.numel() for p in GPT(self.model_cfg).parameters())
        m = self.model_cfg
        return check_plan(
            run_plan(
                self.cfg,
                self.device,
                params=params,
                n_layer=m.n_layer,
                d_model=m.d_model,
                n_head=m.n_head,
                context=m.context,
                vocab=m.vocab_size,
                resumed=self.resume_from is not None,
            ),
            "train",
        )

    def _matched_weights(self, weights: dict, source) -> dict:
        """A checkpoint's tensors under the model's names, checked against it (not yet copied)."""
        if self.hf:
            return self.hf.matched(self.model, weights, source)
        return warmstart.matched_weights(self.model, weights, source)

    def _load_weights(self, weights: dict, source) -> None:
        self._copy_in(self._matched_weights(weights, source))

    @torch.no_grad()
    def _copy_in(self, matched: dict) -> None:
        """Copy checkpoint tensors (under the model's names; a tied head once) into the model."""
        for name, t in self.model.state_dict().items():
            if name in matched:
                t.copy_(matched[name])

    def _warnings(self) -> list[str]:
        """What the run will write that is probably not what was meant (the callback's start
        info carries them; the command line prints each as a warning)."""
        sparse = self.sparsifier is not None or any(stage.sparsity for stage in self.plan)
        warning = (
            loader_warning(self.cfg.encoding, self.run_dir / hfrun.MODEL_DIR, "train")
            if self.hf and sparse and self.resume_from is None
            else None
        )
        short = self.disk_plan.shortfall() if self.disk_plan else None
        return [w for w in (warning, short) if w]

    def _disk_plan(self, run: runstate.RunState) -> diskplan.DiskPlan:
        """What the checkpoints of ``run`` (from its step to its stop) take on disk
        (:mod:`.diskplan`): the model's state-dict entries in float32, AdamW's moments for each
        parameter, the masks when the run is sparse at some stage."""
        cfg = self.cfg
        entries = [(n, t.numel()) for n, t in self.model.state_dict().items()]
        targeted = [(n, self.targets[n].numel()) for n in self.target_plan.targeted]
        sparse = self.sparsifier is not None or any(stage.sparsity for stage in self.plan)
        algorithm = (self.sparsifier_config or {}).get("algorithm") or cfg.algorithm
        other, final, name = 512, None, "model.safetensors"  # config.json; a copy of the model
        if self.hf:
            other = sum(len(b) for b in self.hf.files.values()) + 4096  # tokenizer, config
            final = self.hf.export_bytes(self.model, targeted if sparse else [], cfg.encoding)
            final, name = final + other, f"{hfrun.MODEL_DIR}/"
        return diskplan.estimate(
            entries=entries,
            params=[p.numel() for p in self.model.parameters()],
            targeted=targeted,
            sparse=sparse,
            algorithm=algorithm,
            sharded=self.sharded,
            other=other,
            final=final,
            final_name=name,
            saves=diskplan.checkpoint_steps(run.step, run.stop, cfg.save_every),
            keep_last=cfg.keep_last,
            free=diskplan.free_bytes(self.run_dir),
        )

    @property
    def num_params(self) -> int:
        """The model's parameters (a tied head counted once)."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step, over every rank and micro-batch."""
        return self.cfg.batch_size * self.cfg.grad_accum * self.world

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.model_cfg.context

    # ------------------------------------------------------------------ sparsity
    def stage_at(self, step: int) -> int:
        """The stage (0-based) that trains ``step`` (0-based); past the plan, the last."""
        for i, stage in enumerate(self.plan):
            if stage.start <= step < stage.end:
                return i
        return len(self.plan) - 1

    def _sparsifier_config(self, stage: Stage, later_stage: bool) -> dict | None:
        config = sparsifier_config(self.cfg, stage.sparsity, self.init_masks, later_stage)
        if config is not None and (self.cfg.include or self.cfg.exclude):
            # The sparsifier selects by param_filter globs: hand it the planned names exactly.
            config["param_filter"] = list(self.target_plan.targeted)
        return config

    def _build_sparsifier(self, stage_idx: int, state: dict | None, config: dict | None = None):
        """The stage's sparsifier, attached; ``config`` (a resumed run's saved mapping) wins over
        the one derived from the options, so a resume never depends on re-reading --init."""
        stage = self.plan[stage_idx]
        if config is None:
            config = self._sparsifier_config(stage, later_stage=stage_idx > 0)
        if config is None:
            return None
        try:
            from sparsetool.train.algorithms import build_sparsifier
        except ImportError as e:
            raise ConfigError(
                f"sparse training is unavailable in this installation ({e})"
            ) from None
        sparsifier = build_sparsifier(config)
        if state is not None:
            sparsifier.load_state_dict(state)
        elif stage_idx == 0 and self.init_masks:
            # whole masks: laid out like their sharded weights when attached
            sparsifier.init_masks = {
                n: m if self.sharded else m.to(self.device) for n, m in self.init_masks.items()
            }
        sparsifier.attach(
            dict(self.model.named_parameters()), self.optimizer, stage.end, self.cfg.warmup
        )
        if state is None and stage_idx == 0 and self.init_masks:
            further = (
                sparsifier.prune_further()
            )  # --init SPARSE --sparsity S: a higher S prunes from its masks
            sparsifier.mask_origin = self.init_mask_origin + (
                ", pruned further" if further else ", kept"
            )
        elif state is not None:  # a resume: where the masks first came from, as run.json says
            sparsifier.mask_origin = (
                runstate.earlier_settings(self.run_dir, stage_idx + 1, self.resume_from)
                .get(stage_idx + 1, {})
                .get("initial_mask")
            )
        if set(sparsifier.masks) != set(self.targets):
            raise ConfigError(
                f"the sparsifier masks {sorted(sparsifier.masks)[:3]}..., expected the targeted "
                f"{sorted(self.targets)[:3]}...; check --param-filter"
            )
        self.sparsifier_config = config
        self.resolved_settings[stage_idx + 1] = (
            sparsifier.resolved()
        )  # run.json, keyed by 1-based stage
        self._sparsifier_generation += 1  # invalidates the cached sparsity
        return sparsifier

    def sparsity(self) -> float:
        """Sparsity of the targeted weights (0.0 while dense); recounted only when the masks may
        have changed (a new sparsifier, or a mask update)."""
        if self.sparsifier is None:
            return 0.0
        key = (self._sparsifier_generation, self.sparsifier.updates_done)
        if self._sparsity_cache is None or self._sparsity_cache[0] != key:
            self._sparsity_cache = key, float(self.sparsifier.sparsity())
        return self._sparsity_cache[1]

    # ------------------------------------------------------------------ helpers

    def _sync_step(self, loss: torch.Tensor, stop: StopRequest) -> tuple[float, str | None]:
        """The step's loss averaged over ranks, and the signal that ends the run after this step
        (None: none came). Under DDP the flags of the signals each rank has seen ride in the
        loss's all-reduce, so every rank decides to stop after the same step (a signal sent to
        one rank stops them all); a rank that saw none reports the others'."""
        own = stop.pending()  # read once: a signal handled during the all-reduce waits a step
        if self.world == 1:
            return float(loss), own and signal_name(own)
        seen = [float(own == s) for s in SIGNALS]
        values = torch.cat(
            [loss.reshape(1), torch.tensor(seen, dtype=loss.dtype, device=loss.device)]
        )
        dist.all_reduce(values)
        values /= self.world
        came = [s for s, v in zip(SIGNALS, values[1:].tolist()) if v > 0]
        return float(values[0]), signal_name(own or came[0]) if came else None

    def rank_mask_digests(self) -> list[str] | None:
        """Every rank's mask digest (None on one process or when dense)."""
        if self.world == 1 or self.sparsifier is None:
            return None
        if self.sharded:  # each rank keeps a slice: compare the whole masks each decided on
            return gather_digests(self.sparsifier.decisions_digest(), self.world)
        return gather_mask_digests(self.sparsifier.masks, self.world)

    @torch.no_grad()
    def evaluate(self) -> float:
        """The validation loss (the next-token loss over the held-out batches); a second signal
        during it ends the process at once, as during a step."""
        with self.stop_request.at_once():
            return self._validation_loss()

    def _validation_loss(self) -> float:
        self.model.eval()
        total, n = 0.0, 0
        bs = self.cfg.batch_size
        for i in range(0, self.val_x.size(0), bs):
            x = self.val_x[i : i + bs].to(self.device)
            y = self.val_y[i : i + bs].to(self.device)
            with self.autocast():
                _, loss = self.lm_forward(self.model, x, y)
            total += float(loss) * x.size(0)
            n += x.size(0)
        self.model.train()
        return total / n

    def _clip(self) -> float:
        """Global gradient-norm clipping (max norm ``grad_clip``; 0 only measures the norm).

        Runs after ``sparsifier.before_step``, so the gradients of pruned weights are already 0
        and the norm is that of what the sparse model really trains. The order does not change
        any mask decision: clipping scales every gradient by one positive factor, and RigL and
        GraNet rank |grad| (scale-invariant) inside ``before_step``."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        # the norm over every rank's slices when sharded (gathered as one number), then the clip
        norm = gathered(torch.nn.utils.get_total_norm(grads, foreach=True))
        if self.cfg.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(
                [p for p in self.model.parameters() if p.grad is not None],
                self.cfg.grad_clip,
                norm,
                foreach=True,
            )
        return float(norm)

    # ------------------------------------------------------------------ run
    def run(self, stop_on_signal: bool = False) -> dict:
        """Train to ``--steps`` (or ``--stop-at``) and return the summary. ``stop_on_signal``:
        SIGINT/SIGTERM during the loop stop it after the step in progress with a checkpoint
        (the summary's ``interrupted`` names the signal); a second one raises
        :class:`~sparsetool.errors.Interrupted` at once."""
        stop_request = StopRequest(
            stop_on_signal, notice=self._notice, on_second=self._stopped_at_once
        )
        self.stop_request = stop_request
        with stop_request:
            try:
                return self._run(stop_request)
            except OSError as e:  # a save that failed (no space, read-only, ...): one clean line
                kept = (
                    "the run stopped; its checkpoints saved before stay (--resume continues)"
                    if (self.run_dir / "latest").exists()
                    else "the run stopped before its first checkpoint"
                )
                raise write_error(e, self.run_dir, "-o", kept) from None

    def _notice(self, name: str) -> None:
        if self.master:
            self.callback("signal", {"signal": name})

    def _stopped_at_once(self, first: int, second: int) -> None:
        """Just before a second signal ends the process during a step's computation: the
        callback's ``signal`` info carries the error it stops with (``error``)."""
        if self.master:
            error = runstate.interrupted(
                self.run_dir,
                self.step_in_progress,
                self.world,
                signal_name(first),
                signal_name(second),
            )
            self.callback("signal", {"signal": signal_name(second), "error": str(error)})

    def _run(self, stop_request: StopRequest) -> dict:
        run = self._start_run()
        step = run.step  # the step in progress (0-based), named if a second signal stops it
        try:
            for step in range(run.step, run.stop):
                self.step_in_progress = step
                self._enter_stage(step, run)
                self._train_step(step, run, stop_request)
                self._evaluate_and_save(run)
                if run.interrupted:
                    break
            return self._end_run(run)
        except KeyboardInterrupt:
            self.log.close()
            second = signal_name(stop_request.second) if stop_request.second else None
            raise runstate.interrupted(
                self.run_dir, step, self.world, stop_request.name, second
            ) from None

    def _start_run(self) -> runstate.RunState:
        """Where the run starts: a resume's checkpoint restored (weights, optimizer, RNG, data
        position), the stage's sparsifier attached, run.json written, the log opened (a resume
        keeps its records up to the checkpoint) and the start info handed to the callback."""
        cfg = self.cfg
        run, resume = runstate.RunState(), {}
        if self.resume_from is not None and self.sharded:
            run, resume = runstate.restore_sharded(self)
        elif self.resume_from is not None:
            run, resume, weights = runstate.restore(self.resume_from, self.world, cfg)
            self._load_weights(weights, self.resume_from)
            self.optimizer.load_state_dict(resume["optimizer"])
        self.resolved_settings = runstate.earlier_settings(
            self.run_dir, run.stage, self.resume_from
        )
        self.sparsifier = None  # a resume of a dense stage stays dense
        if self.resume_from is None or resume.get("sparsifier") is not None:
            saved_config = resume.get("sparsifier_config")
            self.sparsifier = self._build_sparsifier(
                run.stage,
                resume.get("sparsifier"),
                json.loads(saved_config) if saved_config else None,
            )
        run.stop = cfg.stop_at or cfg.steps
        # the disk its checkpoints take: refused now if the first cannot be written
        self.disk_plan = self._disk_plan(run)
        self.disk_plan.check(self.run_dir)
        if self.master:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            runstate.write_run_json(self)
        self.log = (
            runfiles.Log(self.run_dir, keep_until=run.step if self.resume_from else None)
            if self.master
            else runstate.NullLog()
        )
        self.callback("start", self._start_info(run))
        self.model.train()
        done_train = [r for r in self.log.records if r.get("kind") == "train"]
        done_eval = [r for r in self.log.records if r.get("kind") == "eval"]
        run.loss = done_train[-1]["loss"] if done_train else float("nan")
        run.val_loss = done_eval[-1]["val_loss"] if done_eval else None
        run.started = time.perf_counter()
        return run

    def _start_info(self, run: runstate.RunState) -> dict:
        """The callback's ``start`` info: the run's shape, data, devices, stages and warnings."""
        return {
            "run_dir": str(self.run_dir),
            "params": self.num_params,
            "model": self.model_cfg.to_dict(),
            "data": self.corpus_info,
            "world_size": self.world,
            "global_batch": self.global_batch,
            "tokens_per_step": self.tokens_per_step,
            "start_step": run.step,
            "steps": self.cfg.steps,
            "stop": run.stop,
            "device": str(self.device),
            "precision": self.precision,
            "stages": [asdict(stage) for stage in self.plan],
            "sparsity": self.sparsity(),
            "distributed": (self.cfg.distributed if self.world > 1 or self.sharded else None),
            "memory_plan": self.memory_plan.describe() if self.memory_plan else None,
            "disk_plan": self.disk_plan.describe() if self.disk_plan else None,
            "disk": self.disk_plan.to_json() if self.disk_plan else None,
            "sparse_training": self.sparsifier.resolved() if self.sparsifier is not None else None,
            "distillation": distill.describe(
                self.teacher, self.cfg.distill_temperature, self.cfg.distill_alpha
            )
            if self.teacher is not None
            else None,
            "warnings": self._warnings(),
            "notes": [self.init_note] * bool(self.init_note)
            + ([] if self.plots else [runfiles.NO_PLOT.format(extra=PLOT_EXTRA)]),
        }

    def _enter_stage(self, step: int, run: runstate.RunState) -> None:
        """At a stage's first step (Variable SPDF): densify, or re-sparsify at the new level."""
        idx = self.stage_at(step)
        if idx == run.stage:
            return
        if self.sparsifier is not None:
            self.sparsifier.densify()
            self.sparsifier = None
        run.stage = idx
        self.sparsifier = self._build_sparsifier(idx, None)
        rec = {
            "kind": "stage",
            "step": step,
            "stage": idx + 1,  # 1-based, as printed
            "sparsity": self.sparsity(),
        }
        self.log.write(rec)
        if self.master:
            runstate.write_run_json(self)
        self.callback("stage", rec)

    def _train_step(self, step: int, run: runstate.RunState, stop_request: StopRequest) -> None:
        """One optimizer step (0-based ``step``), ``run`` advanced past it; its record logged
        (every --log-every steps, at the stop and after a mask update) and handed to the
        callback. A signal that came during it makes it the last."""
        cfg = self.cfg
        t0 = time.perf_counter()
        with stop_request.at_once():  # computation only: a second signal ends the process here
            loss = self._accumulate_gradients(run.position)
            grad_norm, lr, update = self._optimizer_step(step)
        run.position += self.global_batch
        updated = update is not None
        if update is not None:
            self.log.write(update)
        run.loss, signalled = self._sync_step(loss, stop_request)
        dt = time.perf_counter() - t0
        run.tokens += self.tokens_per_step
        run.step = done = step + 1
        if signalled and done < run.stop:
            run.interrupted, run.stop = (
                signalled,
                done,
            )  # the step is complete: end as --stop-at does
        rec = {
            "kind": "train",
            "step": done,
            "loss": round(run.loss, 6),
            "lr": lr,
            "sparsity": round(self.sparsity(), 6),
            "grad_norm": round(grad_norm, 6),
            "tokens_per_s": round(self.tokens_per_step / dt, 1),
            "tokens": run.tokens,
            "elapsed_s": round(run.elapsed(), 3),
        }
        if done % cfg.log_every == 0 or done == run.stop or updated:
            self.log.write(rec)
        self.callback("step", rec)

    def _accumulate_gradients(self, position: int) -> torch.Tensor:
        """Forward and backward over this rank's micro-batches of the global batch that starts at
        data ``position``; their mean loss. The global batch is laid out micro-batch-major, then
        rank, so N ranks x B equal one process with N*B (the same samples, same order); under
        DDP the gradients are all-reduced on the last micro-batch."""
        cfg = self.cfg
        model = self.ddp or self.model
        loss_sum = torch.zeros((), device=self.device)
        for micro in range(cfg.grad_accum):
            first = position + (micro * self.world + self.rank) * cfg.batch_size
            x, y = self.sampler.batch(first, cfg.batch_size)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            sync = self.ddp is None or micro == cfg.grad_accum - 1
            with contextlib.nullcontext() if sync else self.ddp.no_sync(), self.autocast():
                _, loss = self.forward(model, x, y)
            (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach()
        return loss_sum / cfg.grad_accum

    def _optimizer_step(self, step: int) -> tuple[float, float, dict | None]:
        """The sparsifier's hooks around clipping and AdamW (the order in the module docstring),
        then a mask update checked across ranks; (gradient norm, learning rate, the record of
        the mask update to log, None without one)."""
        updates_before = self.sparsifier.updates_done if self.sparsifier is not None else 0
        if self.sparsifier is not None:
            self.sparsifier.before_step(step)
        grad_norm = self._clip()
        # after before_step: an IMP pruning step rewinds the schedule it reports
        lr = lr_at(self.sparsifier.lr_step(step) if self.sparsifier is not None else step, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        if self.sparsifier is not None:
            self.sparsifier.after_step(step)
        updated = self.sparsifier is not None and self.sparsifier.updates_done != updates_before
        if updated and self.world > 1:
            self._agree_on_masks()
        self.optimizer.zero_grad(set_to_none=True)
        if not updated:
            return grad_norm, lr, None
        return (
            grad_norm,
            lr,
            {
                "kind": "mask_update",
                "step": step + 1,
                **self.sparsifier.last_event,
                "sparsity": round(self.sparsity(), 6),
            },
        )

    def _agree_on_masks(self) -> None:
        """After a mask update under DDP: count it if the ranks' masks differ (reported: the
        decisions should agree), then broadcast rank 0's (a safety net; the decisions are
        already rank-identical)."""
        if len(set(self.rank_mask_digests())) > 1:
            self.mask_divergences += 1
        elif self.sharded:
            return  # agreed: a broadcast would gather every whole mask for nothing
        self.sparsifier.broadcast_masks()

    def _evaluate_and_save(self, run: runstate.RunState) -> None:
        """After a step: the validation loss every --eval-every steps and at --steps, a
        checkpoint every --save-every steps and at the stop; a stop by a signal logged after
        its checkpoint."""
        cfg, done = self.cfg, run.step
        if (cfg.eval_every and done % cfg.eval_every == 0) or done == cfg.steps:
            run.val_loss = self.evaluate()
            ev = {"kind": "eval", "step": done, "val_loss": round(run.val_loss, 6)}
            self.log.write(ev)
            self.callback("eval", ev)
        if (cfg.save_every and done % cfg.save_every == 0) or done == run.stop:
            runstate.save(self, run)
        if run.interrupted:
            self.log.write(
                {
                    "kind": "interrupt",
                    "step": done,
                    "signal": run.interrupted,
                    "checkpoint": runfiles.checkpoint_name(done),
                }
            )

    def _end_run(self, run: runstate.RunState) -> dict:
        """The summary, the log closed, the callback's ``end``; the summary."""
        summary = runstate.summary(self, run)
        self.log.close()
        self.callback("end", summary)
        if run.interrupted and self.world > 1:
            # Rank 0 has saved and printed: torchrun stops the other ranks as soon as one
            # exits with a non-zero code, so none leaves before.
            dist.barrier()
        return summary

    def close(self) -> None:
        if (self.world > 1 or self.sharded) and dist.is_initialized():
            dist.destroy_process_group()


def train(
    cfg: TrainConfig,
    resume: bool = False,
    callback: Callback | None = None,
    flag_overrides: dict | None = None,
    stop_on_signal: bool = False,
) -> dict:
    """Train as ``cfg`` says (or continue the run in ``cfg.out`` with ``resume``); the summary.

    ``stop_on_signal`` (what the command line does): the first SIGINT/SIGTERM stops the run after
    the step in progress with a checkpoint, and the summary's ``interrupted`` names the signal;
    a second one raises :class:`~sparsetool.errors.Interrupted`. Without it the handlers are left
    alone and Ctrl-C raises ``Interrupted`` naming the last checkpoint. The summary's
    ``reclaimed`` (not a key): the temporaries of killed runs its writes removed (an error
    carries them too)."""
    with reclaiming() as reclaimed:
        trainer = Trainer(cfg, resume=resume, callback=callback, flag_overrides=flag_overrides)
        try:
            summary = trainer.run(stop_on_signal)
        finally:
            trainer.close()
    return ResultDict(summary, reclaimed)
