"""Device random numbers: reproducible with manual_seed, state round-trips, generators."""

import torch


def test_manual_seed_reproduces():
    torch.manual_seed(123)
    a = torch.randn(100, device="pjrt").cpu()
    torch.manual_seed(123)
    b = torch.randn(100, device="pjrt").cpu()
    assert torch.equal(a, b)
    assert not torch.equal(a, torch.randn(100, device="pjrt").cpu())


def test_rng_state_round_trips():
    torch.pjrt.manual_seed(7)
    state = torch.pjrt.get_rng_state()
    a = torch.rand(10, device="pjrt").cpu()
    torch.pjrt.set_rng_state(state)
    b = torch.rand(10, device="pjrt").cpu()
    assert torch.equal(a, b)


def test_device_generator():
    g = torch.Generator(device="pjrt").manual_seed(5)
    a = torch.randn(8, device="pjrt", generator=g).cpu()
    g.manual_seed(5)
    b = torch.randn(8, device="pjrt", generator=g).cpu()
    assert torch.equal(a, b)


def test_distributions_look_right():
    n = 200_000
    u = torch.rand(n, device="pjrt").cpu()
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    z = torch.randn(n, device="pjrt", dtype=torch.float64).cpu()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    r = torch.randint(3, 9, (n,), device="pjrt").cpu()
    assert r.min() == 3 and r.max() == 8 and r.dtype == torch.int64
    p = torch.randperm(1000, device="pjrt").cpu()
    assert torch.equal(p.sort().values, torch.arange(1000))
    b = torch.empty(n, device="pjrt").bernoulli_(0.3).cpu()
    assert abs(b.mean() - 0.3) < 0.01
    x = torch.ones(n, device="pjrt")
    d = torch.nn.functional.dropout(x, 0.25).cpu()
    assert abs((d == 0).float().mean() - 0.25) < 0.01
    assert torch.allclose(d[d != 0], torch.tensor(1 / 0.75))
    t = torch.empty(n, device="pjrt").normal_(2.0, 3.0).cpu()
    assert abs(t.mean() - 2) < 0.05 and abs(t.std() - 3) < 0.05
    v = torch.empty(n, device="pjrt").uniform_(-2, 4).cpu()
    assert v.min() >= -2 and v.max() < 4
