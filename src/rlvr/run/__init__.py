"""A run's life on disk and across processes: the run directory (`rundir`, `private`), its
checkpoints and what they record (`checkpoint`, `manifest`, `trainer_state`,
`stored_config`), torch.distributed (`distributed`), signals, health checks and memory
(`signals`, `health`, `memory`), metrics and callbacks (`metrics`, `callbacks`)."""
