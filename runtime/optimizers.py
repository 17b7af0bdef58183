"""The optimizer and its learning-rate schedule, which mlp_ddp.py and
benchmarks/time_to_accuracy.py build the same way."""
import torch

SCHEDULES = ("step", "onecycle")


def build_optimizer(model, args, steps_per_epoch):
    """The --optimizer over the model's parameters and its --lr-schedule (None: constant).

    step: StepLR, the rate x --lr-gamma every --lr-step epochs (0: constant), stepped per epoch.
    onecycle: OneCycleLR over the whole run, --lr the peak, stepped after every optimizer step
    (the scheduler's `per_step` says so to the trainer)."""
    # fused: one kernel for all parameters; the per-tensor loop took a third of an MLP step on CPU.
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                    fused=True)
    scheduler = None
    if args.lr_schedule == "onecycle":
        # Warm-up over the first 25 % of the steps, then cosine down to lr / 25 / 1e4: reaches a
        # given accuracy in fewer samples than StepLR here (benchmarks/time_to_accuracy.py). One
        # step more than the run takes: the step after the last one lands on the schedule's end.
        scheduler = torch.optim.lr_scheduler.OneCycleLR(
            optimizer, args.lr, total_steps=args.epochs * steps_per_epoch + 1,
            pct_start=0.25, cycle_momentum=args.optimizer == "sgd")
        scheduler.per_step = True
    elif args.lr_step:
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_step, args.lr_gamma)
    return optimizer, scheduler


def steps_per_epoch(train_samples, args, world_size):
    """Optimizer steps in one epoch: whole global batches (data.shard_indices), cut by
    --max-steps."""
    steps = train_samples // (args.batch_size * args.accum_steps * world_size)
    return min(steps, args.max_steps) if args.max_steps else steps
