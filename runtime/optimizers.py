"""The optimizer and its learning-rate schedule, which mlp_ddp.py and
benchmarks/time_to_accuracy.py build the same way."""
import math

import torch

SCHEDULES = ("onecycle", "step")


class Schedule:
    """The learning rate over the run. The training loop calls `after_step()` after every
    optimizer step and `after_epoch()` after every epoch; the schedule moves on the one it is
    defined by. Checkpoints save and load it like a torch scheduler."""

    def __init__(self, scheduler=None, per_step=False):
        self.scheduler = scheduler  # a torch.optim.lr_scheduler object, or None: constant
        self.per_step = per_step

    def after_step(self):
        if self.scheduler is not None and self.per_step:
            self.scheduler.step()

    def after_epoch(self):
        if self.scheduler is not None and not self.per_step:
            self.scheduler.step()

    def state_dict(self):
        return self.scheduler.state_dict() if self.scheduler is not None else None

    def load_state_dict(self, state):
        if self.scheduler is not None and state:
            self.scheduler.load_state_dict(state)


def one_cycle(total_steps, warmup_fraction=0.25, start=1 / 25, end=1 / 25e4):
    """The factor on the peak rate at optimizer step k (from 0) of a run of `total_steps`: a cosine
    rise from `start` to 1 over the first `warmup_fraction` of the steps, then a cosine fall to
    `end` at the last step, and `end` after it. OneCycleLR's shape, but defined for every length
    (OneCycleLR divides by zero at 3 steps) and a pure function of k, so a checkpoint holds only k
    and a resumed run longer than the first is stretched, never stepped past its end."""
    peak_step = int(warmup_fraction * total_steps)
    decay_steps = max(total_steps - 1 - peak_step, 1)

    def factor(step):
        if step < peak_step:
            rise = (1 - math.cos(math.pi * step / peak_step)) / 2
            return start + (1 - start) * rise
        fall = (1 - math.cos(math.pi * min(1.0, (step - peak_step) / decay_steps))) / 2
        return 1 + (end - 1) * fall

    return factor


def build_optimizer(model, args, steps_per_epoch):
    """The --optimizer over the model's parameters, and its --lr-schedule as a Schedule. `model`
    is the wrapped model (runtime/wrapped_model.WrappedModel), which builds the optimizer over what
    this rank steps (a sharded one: what it owns).

    onecycle: warm-up to --lr over the first quarter of the run, then cosine decay (one_cycle),
    moved after every optimizer step. step: StepLR, the rate x --lr-gamma every --lr-step epochs
    (0: constant), moved after every epoch."""
    # fused: one kernel for all parameters; the per-tensor loop took a third of an MLP step on CPU.
    if args.optimizer == "adam":
        optimizer_class, options = torch.optim.Adam, dict(lr=args.lr, fused=True)
    else:
        optimizer_class = torch.optim.SGD
        options = dict(lr=args.lr, momentum=args.momentum, fused=True)
    optimizer = model.make_optimizer(optimizer_class, **options)
    if args.lr_schedule == "onecycle":
        # Reaches a given accuracy in fewer samples than StepLR here (time_to_accuracy.py).
        factor = one_cycle(args.epochs * steps_per_epoch)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return optimizer, Schedule(scheduler, per_step=True)
    if args.lr_step:
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_step, args.lr_gamma)
        return optimizer, Schedule(scheduler, per_step=False)
    return optimizer, Schedule()


def steps_per_epoch(train_samples, args, world_size):
    """Optimizer steps in one epoch: whole global batches (data.shard_indices), cut by
    --max-steps."""
    steps = train_samples // (args.batch_size * args.accum_steps * world_size)
    return min(steps, args.max_steps) if args.max_steps else steps
