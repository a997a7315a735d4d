"""Invariants of every sparse-training algorithm, on a tiny MLP trained with a real AdamW.

The net's weights are named like sparsetool's GPT (``blocks.N.mlp.fc.weight`` ...) so the default
targets pick them and leave the biases and the head alone.
"""

import copy
import json

import pytest
import torch

from sparsetool.errors import ConfigError
from sparsetool.train.algorithms import ALGORITHMS, build_sparsifier

TOTAL = 40


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Module(), torch.nn.Module()])
        for b in self.blocks:
            b.mlp = torch.nn.Module()
        self.blocks[0].mlp.fc = torch.nn.Linear(16, 32)
        self.blocks[0].mlp.proj = torch.nn.Linear(32, 16)
        self.blocks[1].mlp.fc = torch.nn.Linear(16, 24)
        self.blocks[1].mlp.proj = torch.nn.Linear(24, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        for b in self.blocks:
            x = x + b.mlp.proj(torch.tanh(b.mlp.fc(x)))
        return self.head(x)


SPARSE = [
    "blocks.0.mlp.fc.weight",
    "blocks.0.mlp.proj.weight",
    "blocks.1.mlp.fc.weight",
    "blocks.1.mlp.proj.weight",
]

CONFIGS = {
    "static": {"algorithm": "static", "sparsity": 0.75},
    "gmp": {"algorithm": "gmp", "sparsity": 0.75, "update": {"freq": 5, "start": 0, "stop": 30}},
    "set": {"algorithm": "set", "sparsity": 0.75, "update": {"freq": 5, "stop": 30}},
    "rigl": {
        "algorithm": "rigl",
        "sparsity": 0.75,
        "drop_fraction": 0.5,
        "update": {"freq": 5, "stop": 30},
    },
    "granet": {
        "algorithm": "granet",
        "initial_sparsity": 0.5,
        "sparsity": 0.75,
        "update": {"freq": 5, "start": 5, "stop": 30},
    },
    "imp": {"algorithm": "imp", "sparsity": 0.75, "fraction": 0.3, "rewind_step": 2},
}


def make(algo, seed=0, model_seed=0, **overrides):
    torch.manual_seed(model_seed)
    net = MLP()
    opt = torch.optim.AdamW(net.parameters(), lr=3e-2, weight_decay=0.1)
    sp = build_sparsifier({**CONFIGS[algo], "seed": seed, **overrides})
    sp.attach(net.named_parameters(), opt, TOTAL)
    return net, opt, sp


def batches(n, seed=123):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(n)]


DATA = batches(TOTAL)


def train_step(net, opt, sp, step, hook=None):
    x, y = DATA[step]
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(net(x), y).backward()
    if hook:
        hook("backward", step)
    sp.before_step(step)
    if hook:
        hook("before", step)
    opt.step()
    sp.after_step(step)
    if hook:
        hook("after", step)


def params(net):
    return dict(net.named_parameters())


def masks_copy(sp):
    return {n: m.clone() for n, m in sp.masks.items()}


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_masked_weights_and_adamw_moments_exactly_zero_after_every_step(algo):
    net, opt, sp = make(algo)
    assert sorted(sp.masks) == SPARSE  # default targets: the FFN matrices only
    p = params(net)
    for step in range(TOTAL):
        train_step(net, opt, sp, step)
        for name, m in sp.masks.items():
            w = p[name].detach()
            assert torch.equal(w[~m], torch.zeros_like(w[~m]))
            assert not torch.signbit(w[~m]).any()  # +0.0, never -0.0
            st = opt.state[p[name]]
            assert not st["exp_avg"][~m].any() and not st["exp_avg_sq"][~m].any()
            # kept weights do train (no accidental freezing)
        assert p["head.weight"].ne(0).all()
    assert sp.sparsity() == pytest.approx(0.75, abs=1e-9)


@pytest.mark.parametrize("algo", ["set", "rigl"])
def test_set_rigl_keep_each_tensor_count_and_swap_exactly(algo):
    net, opt, sp = make(algo)
    counts = {n: int(m.sum()) for n, m in sp.masks.items()}
    # uniform 75%: keep = numel - round(0.75 * numel)
    assert counts == {SPARSE[0]: 128, SPARSE[1]: 128, SPARSE[2]: 96, SPARSE[3]: 96}
    swaps = 0
    for step in range(TOTAL):
        before = masks_copy(sp)
        train_step(net, opt, sp, step)
        assert {n: int(m.sum()) for n, m in sp.masks.items()} == counts
        if sp.is_update_step(step):
            f = sp.drop_fraction_at(step)
            for n, m in sp.masks.items():
                expected = round(f * counts[n])
                grown = m & ~before[n]
                dropped = before[n] & ~m
                # Exactly d out and d in: a just-dropped weight regrown would make both smaller.
                assert int(grown.sum()) == int(dropped.sum()) == expected
                swaps += expected
    assert swaps > 0
    assert sp.updates_done == 5  # steps 5, 10, 15, 20, 25 (stop 30 excluded)


def test_set_drop_fraction_is_constant_and_rigl_cosine():
    _, _, s = make("set")
    _, _, r = make("rigl")
    assert [s.drop_fraction_at(t) for t in (5, 25)] == [0.3, 0.3]
    # RigL: 0.5/2 * (1 + cos(pi * t / 30))
    assert r.drop_fraction_at(15) == pytest.approx(0.25)
    assert r.drop_fraction_at(30) == 0.0


def test_rigl_drops_smallest_weights_and_grows_largest_gradients():
    net, opt, sp = make("rigl")
    p = params(net)
    seen = {}

    def hook(when, step):
        if when == "backward" and step == 10:
            seen["w"] = {n: p[n].detach().clone() for n in SPARSE}
            seen["g"] = {n: p[n].grad.clone() for n in SPARSE}
            seen["m"] = masks_copy(sp)
        if when == "after" and step == 10:
            seen["new"] = masks_copy(sp)

    for step in range(11):
        train_step(net, opt, sp, step, hook)
    for n in SPARSE:
        old, new = seen["m"][n], seen["new"][n]
        k, d = int(old.sum()), int((new & ~old).sum())
        assert d == round(sp.drop_fraction_at(10) * k) > 0
        # kept = the k - d largest |w| among the old mask (no ties in random floats)
        w = seen["w"][n].abs().masked_fill(~old, -1).flatten()
        kept = torch.zeros_like(old.flatten())
        kept[w.topk(k - d).indices] = True
        assert torch.equal(new & old, kept.view_as(old))
        # grown = the d largest |grad| among positions pruned before
        g = seen["g"][n].abs().masked_fill(old, -1).flatten()
        grown = torch.zeros_like(old.flatten())
        grown[g.topk(d).indices] = True
        assert torch.equal(new & ~old, grown.view_as(old))


@pytest.mark.parametrize("algo", ["set", "rigl", "granet"])
def test_regrown_weights_start_at_zero_with_zero_moments_then_train(algo):
    net, opt, sp = make(algo)
    p = params(net)
    grown_at = {}
    for step in range(TOTAL):
        before = masks_copy(sp)
        train_step(net, opt, sp, step)
        if step in grown_at.values() or not sp.is_update_step(step):
            continue
        for n, m in sp.masks.items():
            grown = m & ~before[n]
            if grown.any():
                st = opt.state[p[n]]
                assert not p[n].detach()[grown].any()
                assert not st["exp_avg"][grown].any() and not st["exp_avg_sq"][grown].any()
                grown_at[n] = (step, grown)
        if grown_at:
            break
    assert grown_at, "no update regrew anything"
    n, (step, grown) = next(iter(grown_at.items()))
    train_step(net, opt, sp, step + 1)
    still = grown & sp.masks[n]
    assert still.any() and p[n].detach()[still].ne(0).any()  # they learn from the next step on


@pytest.mark.parametrize("algo", ["static", "set", "rigl", "granet"])
def test_same_seed_same_masks_and_global_rng_does_not_matter(algo):
    def run(seed, noise):
        net, opt, sp = make(algo, seed=seed)
        for step in range(TOTAL):
            if noise:
                torch.rand(17)  # another rank / library touching the global RNG
            train_step(net, opt, sp, step)
        return sp.masks

    a, b, c = run(1, False), run(1, True), run(2, False)
    assert all(torch.equal(a[n], b[n]) for n in a)
    if algo in ("static", "set"):  # the seed drives the random choices
        assert any(not torch.equal(a[n], c[n]) for n in a)


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_state_dict_round_trip_gives_identical_later_masks(algo):
    net, opt, sp = make(algo)
    for step in range(17):
        train_step(net, opt, sp, step)
    state = sp.state_dict()
    json.dumps({k: v for k, v in state.items() if k not in ("masks", "grown_before")})  # JSON
    saved_net = {k: v.clone() for k, v in net.state_dict().items()}
    saved_opt = copy.deepcopy(opt.state_dict())  # live tensors otherwise
    for step in range(17, TOTAL):
        train_step(net, opt, sp, step)
    expected = masks_copy(sp)

    torch.manual_seed(999)  # a fresh process: different init, then the checkpoint on top
    net2 = MLP()
    net2.load_state_dict(saved_net)
    opt2 = torch.optim.AdamW(net2.parameters(), lr=3e-2, weight_decay=0.1)
    opt2.load_state_dict(saved_opt)
    sp2 = build_sparsifier({**CONFIGS[algo], "seed": 0})
    sp2.load_state_dict(state)
    sp2.attach(net2.named_parameters(), opt2, TOTAL)
    for step in range(17, TOTAL):
        train_step(net2, opt2, sp2, step)
    assert all(torch.equal(expected[n], sp2.masks[n]) for n in expected)
    assert torch.equal(net.state_dict()[SPARSE[0]], net2.state_dict()[SPARSE[0]])


def test_load_state_dict_refuses_another_algorithm():
    from sparsetool.errors import ConfigError

    _, _, sp = make("set")
    _, _, other = make("rigl")
    with pytest.raises(ConfigError, match="algorithm 'set'"):
        other.load_state_dict(sp.state_dict())


def test_gmp_follows_the_cubic_and_is_exact_at_the_end_step():
    # freq 7 does not divide stop 30: the final sparsity still lands exactly at step 30.
    net, opt, sp = make("gmp", update={"freq": 7, "start": 2, "stop": 30})
    numel = {n: p.numel() for n, p in params(net).items() if n in SPARSE}
    assert sp.sparsity() == 0.0
    updated = []
    for step in range(TOTAL):
        before = masks_copy(sp)
        train_step(net, opt, sp, step)
        for n, m in sp.masks.items():
            assert not (m & ~before[n]).any()  # a pruned weight never comes back
        if sp.is_update_step(step):
            updated.append(step)
            # Zhu & Gupta: s_t = s_f + (s_i - s_f) (1 - (t - t0)/(n dt))^3, s_i = 0, t0 = 2, n dt =
            # 28
            s_t = 0.75 * (1 - (1 - (step - 2) / 28) ** 3)
            for n, m in sp.masks.items():
                assert int((~m).sum()) == round(s_t * numel[n])
    assert updated == [2, 9, 16, 23, 30]
    assert [round(sp.sparsity_at(t), 6) for t in (9, 16, 23)] == [
        round(0.75 * (1 - (1 - 7 / 28) ** 3), 6),
        round(0.75 * (1 - 0.5**3), 6),
        round(0.75 * (1 - 0.25**3), 6),
    ]
    assert all(int((~m).sum()) == round(0.75 * numel[n]) for n, m in sp.masks.items())


def test_gmp_prunes_by_magnitude():
    net, opt, sp = make("gmp")
    p = params(net)
    seen = {}

    def hook(when, step):
        if when == "backward" and step == 10:
            seen["w"] = {n: p[n].detach().clone() for n in SPARSE}
            seen["m"] = masks_copy(sp)

    for step in range(11):
        train_step(net, opt, sp, step, hook)
    for n in SPARSE:
        kept = sp.masks[n]
        w = seen["w"][n].abs()
        assert w[kept].min() >= w[seen["m"][n] & ~kept].max()


def test_granet_layer_scope_ramps_from_half_to_three_quarters_and_regrows():
    net, opt, sp = make("granet", scope="layer")
    assert sp.sparsity() == pytest.approx(0.5)
    grown_total = 0
    for step in range(TOTAL):
        before = masks_copy(sp)
        train_step(net, opt, sp, step)
        if sp.is_update_step(step):
            s_t = 0.75 + (0.5 - 0.75) * (1 - (min(step, 30) - 5) / 25) ** 3  # cubic, t0 = 5, end 30
            for n, m in sp.masks.items():
                assert int((~m).sum()) == round(s_t * m.numel())
                grown_total += int((m & ~before[n]).sum())
    assert grown_total > 0
    assert sp.sparsity() == pytest.approx(0.75)


def test_imp_prunes_a_fraction_of_the_remaining_per_layer_and_rewinds_lr():
    net, opt, sp = make("imp")
    # 0.3 of the remaining per round: 512 -> 358 -> 251 -> 176 -> 128 (target 0.75 is 128 kept)
    assert sp.plan == (4, 8)  # 4 rounds, period = 40 // 5
    history = {n: [int(m.sum())] for n, m in sp.masks.items()}
    for step in range(TOTAL):
        train_step(net, opt, sp, step)
        if sp.is_update_step(step):
            for n, m in sp.masks.items():
                history[n].append(int(m.sum()))
    assert history[SPARSE[0]] == [512, 358, 251, 176, 128]
    assert history[SPARSE[2]] == [384, 269, 188, 132, 96]  # 384*.7=268.8 -> prune 115, ...
    # Each round replays the 40-step schedule, compressed into its 8 steps: from 0 in the first
    # round (x 40/8), from the rewind step 2 after each pruning step (2 + (t - t_r) x 38/8).
    got = [sp.lr_step(t) for t in (0, 1, 7, 8, 9, 15, 16, 32, 39)]
    assert got == pytest.approx([0, 5, 35, 2, 6.75, 35.25, 2, 2, 35.25])
    assert sp.sparsity() == pytest.approx(0.75)


def test_imp_with_rounds_and_no_target():
    net, opt, sp = make("imp", sparsity=None, rounds=2, period=10)
    assert sp.plan == (2, 10)
    for step in range(TOTAL):
        train_step(net, opt, sp, step)
    assert int(sp.masks[SPARSE[0]].sum()) == 251  # 512 -> 358 -> 251, then no more rounds
    # The last round runs from step 20 to the end (20 steps) and replays the schedule from 2.
    assert sp.lr_step(35) == pytest.approx(2 + (35 - 20) * 38 / 20)


@pytest.mark.parametrize("rounds,rewind", [(7, 0), (3, 100), (1, 0)])
def test_imp_every_round_ends_at_the_schedule_minimum(rounds, rewind):
    """Each round is a full training run with the schedule rewound: warm-up, then the cosine
    decay down to its minimum, as a dense run of the whole length ends (the run that used one
    cosine over all steps ended every round near the peak, 9.98e-4 of 1e-3)."""
    from sparsetool.train.recipe import lr_at
    from sparsetool.train.trainconfig import TrainConfig

    cfg = TrainConfig(steps=1000, warmup=100, lr=1e-3, min_lr_ratio=0.1)
    sp = build_sparsifier(
        {"algorithm": "imp", "sparsity": 0.75, "rounds": rounds, "rewind_step": rewind}
    )
    net = MLP()
    sp.attach(net.named_parameters(), torch.optim.AdamW(net.parameters()), cfg.steps)
    n_rounds, period = sp.plan
    assert n_rounds == rounds and period == 1000 // (rounds + 1)
    starts = [r * period for r in range(rounds + 1)]
    ends = starts[1:] + [cfg.steps]
    lrs = [lr_at(sp.lr_step(t), cfg) for t in range(cfg.steps)]
    dense_last = lr_at(cfg.steps - 1, cfg)
    for r, (a, b) in enumerate(zip(starts, ends)):
        last = lrs[b - 1]
        assert last == pytest.approx(1e-4, rel=0.02), (r, last)  # the minimum, 10% of peak
        assert last <= dense_last * 1.02
        peak = max(lrs[a:b])
        assert peak == pytest.approx(1e-3, rel=0.05)  # the peak is reached in every round
        # the first step of a later round restarts the schedule at the rewind point
        if r > 0:
            assert lrs[a] == pytest.approx(lr_at(rewind, cfg))


@pytest.mark.parametrize("sparsity,rounds", [(0.8, 2), (0.75, 3), (0.9, 5)])
def test_imp_reaches_the_sparsity_asked_for_with_rounds(sparsity, rounds):
    """--sparsity 0.8 with rounds=2 ended at 36% (1 - 0.8 ** 2): rounds overrode the target.
    The per-round fraction is now derived from both, and the last round lands on the target."""
    net, opt, sp = make("imp", sparsity=sparsity, rounds=rounds, fraction=None)
    assert sp.fraction == pytest.approx(1 - (1 - sparsity) ** (1 / rounds))
    assert sp.plan[0] == rounds
    for step in range(TOTAL):
        train_step(net, opt, sp, step)
    for name, m in sp.masks.items():
        assert int(m.sum()) == sp.keep_counts(sparsity)[name]


def test_imp_refuses_sparsity_rounds_and_fraction_together():
    with pytest.raises(ConfigError, match="give two of sparsity, rounds and fraction"):
        build_sparsifier({"algorithm": "imp", "sparsity": 0.8, "rounds": 2, "fraction": 0.2})


def test_densify_revives_pruned_weights_from_zero():
    net, opt, sp = make("static")
    p = params(net)
    for step in range(5):
        train_step(net, opt, sp, step)
    pruned = ~sp.masks[SPARSE[0]]
    sp.densify()
    assert sp.masks == {} and sp.sparsity() == 0.0
    assert not p[SPARSE[0]].detach()[pruned].any()
    st = opt.state[p[SPARSE[0]]]
    assert not st["exp_avg"][pruned].any()
    for step in range(5, 8):
        train_step(net, opt, sp, step)
    assert p[SPARSE[0]].detach()[pruned].ne(0).all()
    assert sp.state_dict()["densified"] is True


def test_static_magnitude_init_keeps_the_largest():
    net, opt, sp = make("static", init_method="magnitude")
    torch.manual_seed(0)
    ref = MLP()
    for n in SPARSE:
        w = dict(ref.named_parameters())[n].detach().abs()
        m = sp.masks[n]
        assert int(m.sum()) == m.numel() // 4
        assert w[m].min() >= w[~m].max()


def test_init_masks_are_adopted_and_checked():
    from sparsetool.errors import ConfigError

    torch.manual_seed(0)
    net = MLP()
    given = {n: torch.rand(p.shape) < 0.5 for n, p in net.named_parameters() if n in SPARSE}
    sp = build_sparsifier({"algorithm": "static"})
    sp.init_masks = given
    sp.attach(net.named_parameters(), None, 10)
    assert all(torch.equal(sp.masks[n], given[n]) for n in SPARSE)
    assert not dict(net.named_parameters())[SPARSE[0]].detach()[~given[SPARSE[0]]].any()
    bad = build_sparsifier({"algorithm": "static"})
    bad.init_masks = {SPARSE[0]: given[SPARSE[0]]}
    with pytest.raises(ConfigError, match="missing"):
        bad.attach(MLP().named_parameters(), None, 10)


def test_erk_distribution_keeps_the_total():
    _, _, sp = make("static", distribution="erk")
    total = sum(m.numel() for m in sp.masks.values())
    assert sum(int(m.sum()) for m in sp.masks.values()) == pytest.approx(total * 0.25, abs=2)


def test_prune_further_prunes_init_masks_to_the_sparsity_and_never_revives():
    torch.manual_seed(0)
    net = MLP()
    given = {
        n: torch.arange(p.numel()).reshape(p.shape) % 2 == 0
        for n, p in net.named_parameters()
        if n in SPARSE
    }  # 50% sparse
    same = build_sparsifier({"algorithm": "static", "sparsity": 0.5})
    same.init_masks = given
    same.attach(net.named_parameters(), None, 10)
    assert not same.prune_further()
    assert all(torch.equal(same.masks[n], given[n]) for n in SPARSE)
    sp = build_sparsifier({"algorithm": "static", "sparsity": 0.8})
    sp.init_masks = given
    sp.attach(net.named_parameters(), None, 10)
    assert sp.prune_further()
    assert sp.sparsity() == pytest.approx(0.8, abs=0.01)
    params = dict(net.named_parameters())
    for n in SPARSE:
        assert not torch.any(sp.masks[n] & ~given[n])
        w = params[n].detach()
        assert torch.all(w[~sp.masks[n]] == 0)
