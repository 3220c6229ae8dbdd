"""Train room: GRPO on token-exact rollouts. `grpo` holds the math as pure functions (tested
alone); the DeepSpeed engine loop, publishing and launching build on it (see ../shared/design.md).
Nothing below `train` imports it."""
