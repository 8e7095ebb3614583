"""Stands in for an optimizer module (its path names `optim`, as `torch/optim/sgd.py` does):
`step` launches the parameter update kernel, as torch.optim's optimizers do. perfkit's reports
end a training step at each optimizer step when a Python trace has no step spans."""

RUNTIME, LAUNCH = 2, 2
ENTER, EXIT = 0, 1


def step(held, correlation):
    held.fake_api(RUNTIME, LAUNCH, correlation, ENTER); held.fake_api(RUNTIME, LAUNCH, correlation, EXIT)  # site: update
