"""The SLURM side: a local two-node cluster for trying run_slurm.sh, and the sweep submitter."""
