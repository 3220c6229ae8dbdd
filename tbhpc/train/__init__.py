"""Training: GRPO (and RFT) on token-exact rollouts. `grpo` holds the math as pure functions
(tested alone); the step loop (`loop`), the parts it is built from (`build`), publishing and the
run record build on it; docs/architecture.md places it among the other packages. Nothing below
`train` imports it."""
