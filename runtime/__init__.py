"""What mlp_ddp.py runs on, one job per module, in the order a run uses them.

    options.py      the command line: every option, its range, the checks before training
    launch.py       where the processes come from (local, torchrun, srun) and the process group
    device.py       --device: one device for every rank, its backend, the GPU's float32 policy
    torch_compat.py the older torch names where a cluster's torch lacks the newer ones
      emulated_network.py  --emulate-link, and the command that takes a cluster's network up/down
        shaped_links.py    the network: ranks or nodes in namespaces behind links shaped by tc
    collective_record.py  each rank's last collectives, and the line that started each
    hang_verdict.py       a hang ends the rank, naming where each rank waits and why
    data.py         MNIST / FashionMNIST in memory, offline copies, each rank's shard
    models.py       the MLP and the CNN
    wrappers.py     the --mode wrappers: single, ddp, ddp-no-sync, manual (manual_allreduce.py),
                    sharded (sharded.py)
      wrapped_model.py  WrappedModel: the interface every wrapper has, in a module of its own
      manual_ddp.py     ManualDDP: manual_allreduce.py's strategies behind DDP's interface
      sharded.py        --mode sharded: manual_sharding.py's ZeRO-1/2/3 behind the same interface
      transports.py     --transport: the library's collectives, the ring's or shared memory's
      dtypes.py         the dtype behind each name of --compress, --amp and --compute-dtype
    trainer.py      the one training loop for every mode: Trainer.fit, run_epoch
      step.py         one optimizer step, the trainer's and the benchmarks'
      metrics.py      training loss and accuracy sums, evaluation over a split
      timing.py       where each step's time went: phases, communication busy/hidden/exposed
      memory.py       the bytes of parameters, gradients and optimizer state a rank holds
      guards.py       a NaN loss, a float16 overflow on the wire or ranks whose parameters
                      drifted apart stop every rank
      checkpoint.py   checkpoints and what a resumed run needs
      reporting.py    rank 0's progress and epoch lines, TensorBoard
      faults.py       failures injected on purpose by the tests (hidden --debug-* options)
      across_ranks.py sums and gathers of small values over ranks
    results.py      results/<run>.json: the schema and its check (analysis/ reads a folder of them)
    atomic.py       files written whole or not at all (results, checkpoints, data copies)
"""
