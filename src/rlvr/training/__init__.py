"""One training step and the loop: the run built once (`setup`), rollouts collected and scored
(`collect`, `pipeline`), the batch (`batch`), the update over micro-batches (`update`,
`micro`), the policy and its reference (`policy`, `reference`), PPO's critic (`critic`,
`ppo`), held-out evaluation (`evaluation`) and the loop (`trainer`). The Python API's
`rlvr.train(...)` is `rlvr.api.train`."""
