"""Every updater against torch.optim on the same gradients: 100 steps of float32 parameters, weights and biases
apart (L2 and weight decay on the weights only, as mpitrain's decay mask has it), a learning rate that changes
along the way; the parameters agree within float32 rounding.

SGD with momentum keeps the learning rate inside its velocity (v = mu v - lr g, DL4J's and Sutskever et al.'s form)
where PyTorch multiplies after (b = mu b + g; p -= lr b): the same steps under a constant rate, which its cases use;
under a schedule a change of rate reaches the step gradually here, at once in PyTorch (docs/recipes.md)."""
import numpy as np
import pytest
import torch

from mpitrain.config.sections import OptimizerConfig
from mpitrain.nn.updaters import create_updater

WEIGHTS, BIASES, STEPS = 40, 10, 100
RATES = [0.01 * (1 + np.cos(np.pi * t / STEPS)) / 2 + 1e-4 for t in range(STEPS)]  # a schedule's rates

# mpitrain's optimizer keys -> (torch's optimizer, its keywords; weight_decay goes to the weights' group only)
CASES = {
    "sgd": ({"type": "sgd", "l2": 0.01}, torch.optim.SGD, {"weight_decay": 0.01}),
    "momentum": ({"type": "sgd", "momentum": 0.9, "l2": 0.01}, torch.optim.SGD, {"momentum": 0.9, "weight_decay": 0.01}),
    "nesterov": ({"type": "sgd", "momentum": 0.9, "nesterov": True}, torch.optim.SGD, {"momentum": 0.9, "nesterov": True}),
    "adagrad": ({"type": "adagrad", "eps": 1e-10}, torch.optim.Adagrad, {"eps": 1e-10}),
    "rmsprop": ({"type": "rmsprop", "rho": 0.9}, torch.optim.RMSprop, {"alpha": 0.9}),
    "adam": ({"type": "adam", "l2": 0.01}, torch.optim.Adam, {"weight_decay": 0.01}),
    "amsgrad": ({"type": "adam", "amsgrad": True}, torch.optim.Adam, {"amsgrad": True}),
    "adamw": ({"type": "adamw", "weight_decay": 0.05}, torch.optim.AdamW, {"weight_decay": 0.05}),
    "adamw amsgrad": ({"type": "adamw", "weight_decay": 0.05, "amsgrad": True}, torch.optim.AdamW,
                      {"weight_decay": 0.05, "amsgrad": True}),
    "nadam": ({"type": "nadam", "beta1": 0.95}, torch.optim.NAdam, {"betas": (0.95, 0.999)}),
    "nadam with l2": ({"type": "nadam", "l2": 0.01, "momentum_decay": 0.01}, torch.optim.NAdam,
                      {"weight_decay": 0.01, "momentum_decay": 0.01}),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_an_updater_follows_torch_optim_over_a_hundred_steps(case):
    ours, cls, keywords = CASES[case]
    rates = [RATES[0]] * STEPS if ours.get("momentum") else RATES
    rng = np.random.default_rng(0)
    start = rng.normal(size=WEIGHTS + BIASES).astype(np.float32)
    gradients = rng.normal(size=(STEPS, WEIGHTS + BIASES)).astype(np.float32)
    mask = np.r_[np.ones(WEIGHTS), np.zeros(BIASES)].astype(np.float32)

    params = start.copy()
    updater = create_updater(OptimizerConfig(lr=RATES[0], **ours).validate("test"), params, mask)
    for rate, g in zip(rates, gradients):
        updater.lr = rate
        params += updater.delta(g, params)

    weights, biases = torch.nn.Parameter(torch.tensor(start[:WEIGHTS])), torch.nn.Parameter(torch.tensor(start[WEIGHTS:]))
    decay = keywords.pop("weight_decay", 0.0) if "weight_decay" in keywords else None
    groups = [{"params": [weights], **({"weight_decay": decay} if decay is not None else {})},
              {"params": [biases], "weight_decay": 0.0}]
    optimizer = cls(groups, lr=RATES[0], **keywords)
    for rate, g in zip(rates, gradients):
        for group in optimizer.param_groups:
            group["lr"] = rate
        weights.grad, biases.grad = torch.tensor(g[:WEIGHTS]), torch.tensor(g[WEIGHTS:])
        optimizer.step()
    theirs = np.concatenate([weights.detach().numpy(), biases.detach().numpy()])
    assert not np.allclose(params, start, atol=1e-3)  # they moved
    np.testing.assert_allclose(params, theirs, rtol=2e-5, atol=2e-6)


def test_amsgrad_is_refused_beside_sgd():
    from mpitrain.base.errors import ConfigError
    with pytest.raises(ConfigError, match="optimizer.amsgrad is True, expected false with optimizer.type sgd"):
        OptimizerConfig(type="sgd", amsgrad=True).validate("run.yaml")


def test_adamw_keeps_weight_decay_off_the_biases_and_out_of_the_moments():
    params, mask = np.ones(4, np.float32), np.array([1, 1, 0, 0], np.float32)
    updater = create_updater(OptimizerConfig(type="adamw", lr=0.1, weight_decay=0.5).validate("test"), params, mask)
    delta = updater.delta(np.zeros(4, np.float32), params)
    np.testing.assert_allclose(delta, [-0.05, -0.05, 0.0, 0.0])  # lr wd p on the weights, nothing else
    assert not updater.state.any()  # a zero gradient: zero moments, whatever the decay
