"""GRPO-family trainer.

Modules: `losses` (registered advantage / aggregation / off-policy pieces and `policy_loss`),
`batch` (`TrainBatch`, `pad_batch`), `optim` (AdamW schedule), `config` (`TrainerConfig`, the
typed `conf/trainer/*.yaml`), `step` (the pure jitted train step), `trainer` (`Trainer`).
"""
