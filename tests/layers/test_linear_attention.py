"""Linear attention: its fast-weight form, recurrent = parallel, FAVOR+ within its error."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import raises_naming

import vision_tfm as vt
from vision_tfm.config import ConfigError
from vision_tfm.errors import InputError
from vision_tfm.layers import Attention, FeatureMap, fast_weight_attention, linear_attention

MAPS = ["elu1", "relu", "favor"]


def split_heads(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k, v ``(B, h, N, d)`` the way the layer computes them."""
    qkv = attn.qkv(x).unflatten(-1, (3 * attn.num_heads, attn.head_dim))
    return qkv.transpose(-3, -2).chunk(3, dim=-3)


@pytest.mark.parametrize("kind", MAPS)
def test_linear_attention_equals_fast_weight_form_with_padding(kind: str) -> None:
    torch.manual_seed(0)
    attn = Attention(32, 4, attn_type="linear", feature_map=kind, favor_seed=1).eval()
    x = torch.randn(2, 11, 32)
    keep = torch.ones(2, 11, dtype=torch.bool)
    keep[1, 7:] = False  # the second sequence is 7 tokens plus 4 of padding
    mask = keep[:, None, None, :]  # (B, 1, 1, N): a key-padding mask
    with torch.no_grad():
        out = attn(x, mask=mask)
        q, k, v = split_heads(attn, x)
        fw = fast_weight_attention(q, k, v, attn.feature_map, key_mask=keep[:, None, :])
        ref = attn.proj(fw.transpose(1, 2).reshape(2, 11, 32))
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
        # padding is invisible: the real tokens read what the unpadded sequence gives them
        alone = attn(x[1:, :7])
        torch.testing.assert_close(out[1:, :7], alone, atol=1e-5, rtol=0)
        # and what sits in the padded slots does not matter
        x2 = x.clone()
        x2[1, 7:] = 100 * torch.randn(4, 32)
        torch.testing.assert_close(attn(x2, mask=mask)[1, :7], out[1, :7], atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", MAPS)
def test_causal_recurrent_fast_weights_equal_parallel_form(kind: str) -> None:
    torch.manual_seed(0)
    fm = FeatureMap(kind, 8, num_features=24, seed=0)
    q, k, v = torch.randn(3, 2, 2, 9, 8).unbind(0)
    recurrent = fast_weight_attention(q, k, v, fm, causal=True)  # W updated token by token
    parallel = linear_attention(fm(q, query=True), fm(k, query=False), v, causal=True)
    torch.testing.assert_close(recurrent, parallel, atol=1e-5, rtol=0)
    if kind == "elu1":  # the first token reads only itself (relu's features can all be 0)
        torch.testing.assert_close(recurrent[..., 0, :], v[..., 0, :], atol=1e-5, rtol=0)
    # the last token reads everything: the non-causal form
    full = fast_weight_attention(q, k, v, fm)
    torch.testing.assert_close(recurrent[..., -1, :], full[..., -1, :], atol=1e-5, rtol=0)


def test_favor_kernel_error_matches_the_performer_prediction() -> None:
    """Performer (Choromanski et al. 2020, Lemma 2): with m i.i.d. positive random features,
    ``MSE = exp(|x+y|²) SM(x,y)² (1 - exp(-|x+y|²)) / m``; orthogonal features do better."""
    torch.manual_seed(0)
    d, pairs, draws = 16, 32, 200
    x, y = torch.randn(2, pairs, d).mul(0.4).unbind(0)
    exact = torch.exp((x * y).sum(-1) / math.sqrt(d))  # SM(x, y) at the 1/sqrt(d) scale
    s2 = ((x + y) ** 2).sum(-1) / math.sqrt(d)  # |x' + y'|², x' = x / d**0.25
    for m in (16, 256):
        predicted = torch.exp(s2) * exact**2 * (1 - torch.exp(-s2)) / m  # per pair
        for orthogonal, lo, hi in ((False, 0.8, 1.25), (True, 0.4, 0.9)):
            # one draw of draws * m rows = `draws` independent estimators of m rows each
            # (m is a multiple of d, so no orthogonal block straddles two of them)
            fm = FeatureMap("favor", d, draws * m, seed=0, orthogonal=orthogonal)
            feats = torch.exp(fm.favor_exponents(x) + fm.favor_exponents(y))  # (pairs, draws*m)
            est = feats.unflatten(-1, (draws, m)).mean(-1)  # (pairs, draws)
            mse = ((est - exact[:, None]) ** 2).mean(-1)  # (pairs,)
            # median over pairs: the estimator is log-normal, so a pair's sample MSE has rare
            # huge draws that would make a mean over pairs swing by 3x between seeds
            ratio = (mse / predicted).median().item()
            assert lo < ratio < hi, (m, orthogonal, ratio)


def test_favor_attention_converges_to_softmax_attention() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 2, 64, 16).unbind(0)
    q, k = q * 0.5, k * 0.5
    exact = F.scaled_dot_product_attention(q, k, v)

    def err(m: int) -> float:
        fm = FeatureMap("favor", 16, m, seed=0)
        return (linear_attention(fm(q, True), fm(k, False), v) - exact).abs().mean().item()

    few, many = err(64), err(4096)
    assert many < few / 4 and many < 0.01  # error ~ 1/sqrt(m): 8x fewer at 64x the features


@pytest.mark.parametrize("kind", MAPS)
def test_linear_attention_gradcheck_float64(kind: str) -> None:
    torch.manual_seed(0)
    attn = Attention(8, 2, attn_type="linear", feature_map=kind, favor_seed=0).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)[:, None, None]
    assert torch.autograd.gradcheck(lambda t: attn(t, mask=mask), (x,))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_long_sequence_keeps_fp32_sums(dtype: torch.dtype) -> None:
    """8192 tokens of large values: key-value sums past fp16's 65504 stay finite."""
    torch.manual_seed(0)
    attn = Attention(64, 2, attn_type="linear", feature_map="elu1").eval()
    x = torch.randn(1, 8192, 64) * 16
    with torch.no_grad():
        ref = attn(x)
        _, k, v = split_heads(attn, x)
        kv_sum = ((F.elu(k) + 1).transpose(-2, -1) @ v).abs().max()
        assert kv_sum > torch.finfo(torch.float16).max  # summing in fp16 would overflow
        with torch.autocast("cpu", dtype=dtype):
            low = attn(x)
    assert low.dtype == dtype and torch.isfinite(low).all()
    rel = (low.float() - ref).norm() / ref.norm()
    assert rel < 1e-2, rel


def test_favor_projection_is_a_seeded_redrawable_buffer() -> None:
    a = Attention(16, 2, attn_type="linear", feature_map="favor", num_features=12, favor_seed=3)
    b = Attention(16, 2, attn_type="linear", feature_map="favor", num_features=12, favor_seed=3)
    proj = a.feature_map.proj
    assert proj.shape == (12, 8) and "feature_map.proj" in a.state_dict()
    torch.testing.assert_close(proj, b.feature_map.proj, atol=0, rtol=0)
    # rows in one block of 8 are orthogonal
    gram = proj[:8] @ proj[:8].T
    torch.testing.assert_close(gram - torch.diag(gram.diag()), torch.zeros(8, 8), atol=1e-4, rtol=0)
    b.feature_map.redraw(4)
    assert not torch.equal(proj, b.feature_map.proj)
    b.load_state_dict(a.state_dict())  # a checkpoint restores the very projection
    torch.testing.assert_close(proj, b.feature_map.proj, atol=0, rtol=0)


def test_linear_attention_weights_explain_its_output() -> None:
    """``return_attn`` forms the implied (N, N) weights: rows sum to 1, and weights @ v = out."""
    torch.manual_seed(0)
    attn = Attention(16, 2, attn_type="linear", feature_map="elu1").eval()
    x = torch.randn(1, 6, 16)
    with torch.no_grad():
        out, w = attn(x, return_attn=True)
        torch.testing.assert_close(w.sum(-1), torch.ones(1, 2, 6))
        _, _, v = split_heads(attn, x)
        torch.testing.assert_close(attn.proj((w @ v).transpose(1, 2).reshape(1, 6, 16)), out)


def test_linear_attention_refuses_bias_and_query_masks() -> None:
    attn = Attention(16, 2, attn_type="linear")
    x = torch.randn(1, 4, 16)
    with raises_naming(InputError, "bias"):
        attn(x, bias=torch.zeros(2, 4, 4))
    with raises_naming(InputError, "(4, 4)"):  # a (N, N) query mask; key-padding is (..., 1, N)
        attn(x, mask=torch.ones(4, 4, dtype=torch.bool))


@pytest.mark.parametrize("name", ["vit_test", "hybrid_test", "grasp_hybrid_t"])
def test_models_select_linear_attention_through_their_config(name: str) -> None:
    m = vt.create_model(name, attn_type="linear", feature_map="favor", favor_features=10)
    layers = [a for a in m.modules() if isinstance(a, Attention)]
    assert layers and all(a.feature_map.num_features == 10 for a in layers)
    soft = vt.create_model(name)
    assert all(a.feature_map is None for a in soft.modules() if isinstance(a, Attention))
    assert set(m.state_dict()) - set(soft.state_dict()) == {
        k for k in m.state_dict() if k.endswith("feature_map.proj")
    }


@pytest.mark.parametrize(
    "over, key",
    [
        ({"attn_type": "performer"}, "attn_type"),
        ({"attn_type": "linear", "feature_map": "exp"}, "feature_map"),
        ({"favor_features": -1}, "favor_features"),
    ],
)
def test_bad_attention_options_name_the_key(over: dict, key: str) -> None:
    with raises_naming(ConfigError, "vit_test", key, over[key]):
        vt.create_model("vit_test", **over)


def test_swin_keeps_softmax() -> None:
    with raises_naming(ConfigError, "swin_mnist", "attn_type"):
        vt.create_model("swin_mnist", attn_type="linear")
