"""Property tests of the shared core."""

import math

import pytest
import torch
from conftest import raises_naming

from vision_tfm.errors import InputError
from vision_tfm.layers import (
    NORM_PLACEMENTS,
    Attention,
    Block,
    DropPath,
    LayerNorm2d,
    Mlp,
    PatchEmbed,
    Rope,
    SwiGLU,
    apply_rope,
    block_stack,
    fused_attn,
    relative_position_bias,
    relative_position_index,
    resample_abs_pos_embed,
    rope_2d,
    run_blocks,
    sincos_2d,
)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_fused_and_explicit_attention_agree_with_bias_and_mask(qk_norm):
    torch.manual_seed(0)
    attn = Attention(32, 4, qk_norm=qk_norm).eval()
    x = torch.randn(2, 3, 10, 32)  # extra leading dim, as Swin windows use
    bias = torch.randn(3, 4, 10, 10)
    mask = torch.rand(10, 10) > 0.3
    mask |= torch.eye(10, dtype=torch.bool)  # every query keeps at least one key
    fused = attn(x, bias=bias, mask=mask)
    with fused_attn(attn, False):
        explicit, weights = attn(x, bias=bias, mask=mask, return_attn=True)
    assert attn.fused  # restored
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=0)
    assert weights.shape == (2, 3, 4, 10, 10)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4, 10))
    assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


def test_plain_core_branches_agree_on_windows_with_bias_mask_and_an_empty_row(monkeypatch):
    """fp32: SDPA and the explicit path of the plain core give one output and one gradient on
    Swin-like windows with a per-window bias and mask, where one query may attend to nothing
    (zeros on both paths, so the layer returns the projection's bias there)."""
    from vision_tfm.layers import attention

    torch.manual_seed(0)
    attn = Attention(32, 4)
    x = torch.randn(2, 3, 10, 32, requires_grad=True)  # (B, windows, N, C)
    bias = torch.randn(3, 4, 10, 10)  # (windows, heads, N, N)
    mask = torch.rand(3, 1, 10, 10) > 0.3
    mask |= torch.eye(10, dtype=torch.bool)
    mask[1, :, 0] = False  # window 1: query 0 sees no key
    sdpa_calls = []
    sdpa = attention.sdpa_attention
    monkeypatch.setattr(attention, "sdpa_attention", lambda *a: sdpa_calls.append(1) or sdpa(*a))
    results = []
    for fused in (True, False):
        attn.fused = fused
        out = attn(x, bias=bias, mask=mask)
        (grad,) = torch.autograd.grad(out.square().sum(), x)
        results.append((out.detach(), grad))
    assert len(sdpa_calls) == 1  # the fused branch only
    (out, grad), (want, want_grad) = results
    torch.testing.assert_close(out, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, want_grad, atol=1e-5, rtol=1e-5)  # finite on both
    torch.testing.assert_close(out[:, 1, 0], attn.proj.bias.detach().expand(2, -1))


def test_a_query_with_no_allowed_key_gets_zeros_on_both_paths():
    torch.manual_seed(0)
    attn = Attention(16, 2).eval()
    x = torch.randn(1, 9, 16)
    mask = torch.ones(9, 9, dtype=torch.bool)
    mask[0] = False  # query 0 may attend to nothing
    with torch.no_grad():
        fused = attn(x, mask=mask)
        with fused_attn(attn, False):
            explicit = attn(x, mask=mask)
    torch.testing.assert_close(explicit, fused, atol=1e-6, rtol=0)
    torch.testing.assert_close(explicit[0, 0], attn.proj.bias)  # zero attention output


def test_windowed_attention_gradients_match_a_manual_reference():
    torch.manual_seed(0)
    attn = Attention(16, 2)
    x = torch.randn(2, 3, 7, 16, requires_grad=True)  # (B, windows, N, C): the training path
    bias = torch.randn(3, 2, 7, 7)
    attn(x, bias=bias).square().sum().backward()
    got = [x.grad, attn.qkv.weight.grad, attn.proj.weight.grad]
    x2 = x.detach().clone().requires_grad_()
    for p in attn.parameters():
        p.grad = None
    q, k, v = attn.qkv(x2).reshape(2, 3, 7, 3, 2, 8).permute(3, 0, 1, 4, 2, 5)
    w = torch.softmax(q @ k.transpose(-1, -2) * 8**-0.5 + bias, -1)
    out = attn.proj((w @ v).transpose(2, 3).reshape(2, 3, 7, 16))
    out.square().sum().backward()
    for a, b in zip(got, [x2.grad, attn.qkv.weight.grad, attn.proj.weight.grad]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_attention_matches_manual_softmax():
    torch.manual_seed(0)
    attn = Attention(8, 2, qkv_bias=False).eval()
    x = torch.randn(1, 5, 8)
    q, k, v = attn.qkv(x).reshape(1, 5, 3, 2, 4).permute(2, 0, 3, 1, 4)
    ref = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v  # scale = 4 ** -0.5
    ref = attn.proj(ref.transpose(1, 2).reshape(1, 5, 8))
    torch.testing.assert_close(attn(x), ref, atol=1e-6, rtol=0)


def test_attention_rejects_bad_heads_and_float_mask():
    with raises_naming(ValueError, 10, 3):  # dim, num_heads
        Attention(10, 3)
    with raises_naming(InputError, "bool", "torch.float32"):  # the dtype wanted, the one given
        Attention(8, 2)(torch.randn(1, 3, 8), mask=torch.ones(3, 3))


def test_relative_position_index_7x7():
    idx = relative_position_index((7, 7))
    assert idx.shape == (49, 49)
    assert idx[0, 0] == 84
    assert idx.min() == 0 and idx.max() == 168
    assert len(idx.unique()) == 169
    # same offset -> same index: (0,0)->(0,1) equals (3,3)->(3,4)
    assert idx[0, 1] == idx[3 * 7 + 3, 3 * 7 + 4]
    table = torch.arange(169 * 2, dtype=torch.float).reshape(169, 2)
    bias = relative_position_bias(table, idx)
    assert bias.shape == (2, 49, 49) and bias[1, 0, 0] == table[84, 1]


def test_sincos_pinned_values_mae_convention():
    pe = sincos_2d(2, 3, 8)  # 6 tokens, dims [sin x, cos x, sin y, cos y], 2 each
    assert pe.shape == (6, 8)
    # token 0 at (y=0, x=0)
    torch.testing.assert_close(pe[0], torch.tensor([0, 0, 1, 1, 0, 0, 1, 1.0]))
    # token 5 at (y=1, x=2): omega = [1, 1/100]
    x, y = 2.0, 1.0
    want = [
        math.sin(x),
        math.sin(x / 100),
        math.cos(x),
        math.cos(x / 100),
        math.sin(y),
        math.sin(y / 100),
        math.cos(y),
        math.cos(y / 100),
    ]
    torch.testing.assert_close(pe[5], torch.tensor(want), atol=1e-6, rtol=0)
    # token 100 of a 14x14 grid sits at x=2; channel 3 is sin(x * 1e4 ** -(3/96))
    assert sincos_2d(14, 14, 384)[100, 3].item() == pytest.approx(0.99748000, abs=1e-6)


def test_rope_depends_only_on_relative_offset():
    torch.manual_seed(0)
    hd = 16
    sin, cos = rope_2d(6, 6, hd)
    q, k = torch.randn(hd), torch.randn(hd)

    def score(pq, pk):
        i, j = pq[0] * 6 + pq[1], pk[0] * 6 + pk[1]
        rq = apply_rope(q.expand(36, hd), Rope(sin, cos))[i]
        rk = apply_rope(k.expand(36, hd), Rope(sin, cos))[j]
        return (rq @ rk).item()

    s1 = score((1, 1), (2, 4))
    assert s1 == pytest.approx(score((3, 0), (4, 3)), abs=1e-5)
    assert s1 == pytest.approx(score((0, 2), (1, 5)), abs=1e-5)
    assert s1 != pytest.approx(score((1, 1), (2, 5)), abs=1e-3)
    # prefix tokens are not rotated
    x = torch.randn(1, 37, hd)
    out = apply_rope(x, Rope(sin, cos, num_prefix_tokens=1))
    torch.testing.assert_close(out[:, 0], x[:, 0])


def test_rope_changes_attention_and_a_shifted_grid_leaves_it_unchanged():
    """Attention with RoPE on a 3x3 grid placed at rows/cols 0-2 or 2-4 of a 5x5 table:
    every position moves by (2, 2), so the scores, and the output, must not change."""
    torch.manual_seed(0)
    attn = Attention(32, 2).eval()
    x = torch.randn(1, 9, 32)  # no class token: its scores would see absolute positions
    big = rope_2d(5, 5, 16)
    rows = torch.arange(3)

    def at(offset):
        idx = ((rows[:, None] + offset) * 5 + rows[None, :] + offset).reshape(-1)
        return Rope(big[0][idx], big[1][idx])

    with torch.no_grad():
        plain = attn(x)
        a, b = attn(x, rope=at(0)), attn(x, rope=at(2))
    assert (a - plain).abs().max() > 1e-2  # RoPE is applied
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # and only offsets matter


def test_resample_pos_embed_identity_and_shape():
    pe = torch.randn(1, 1 + 14 * 14, 8)
    assert resample_abs_pos_embed(pe, (14, 14), (14, 14)) is pe
    out = resample_abs_pos_embed(pe, (12, 20), (14, 14))
    assert out.shape == (1, 1 + 240, 8)
    torch.testing.assert_close(out[:, 0], pe[:, 0])  # class token untouched
    # a constant table stays constant under bicubic resampling
    const = torch.ones(1, 1 + 16, 4)
    torch.testing.assert_close(resample_abs_pos_embed(const, (7, 5), (4, 4)), torch.ones(1, 36, 4))


def test_post_and_pre_norm_differ_and_are_finite():
    torch.manual_seed(0)
    pre = Block(16, 2, norm_place="pre").eval()
    post = Block(16, 2, norm_place="post").eval()
    post.load_state_dict(pre.state_dict())
    x = torch.randn(2, 5, 16) * 3
    a, b = pre(x), post(x)
    assert torch.isfinite(a).all() and torch.isfinite(b).all()
    assert not torch.allclose(a, b, atol=1e-3)
    # post-norm output is normalised per token
    torch.testing.assert_close(b.mean(-1), torch.zeros(2, 5), atol=1e-5, rtol=0)


def test_residual_stack_matches_the_papers_formula_written_out():
    """ResiDual (Xie et al. 2023, "ResiDual: Transformer with Dual Residual Connections",
    Sec. 3), written out for two blocks (four sublayers f_k, attention then MLP):

        x^a_1 = x^d_1 = x                        both streams start at the stack's input
        x^a_{k+1} = LN_k(x^a_k + f_k(x^a_k))     the Post-LN stream
        x^d_{k+1} = x^d_k + f_k(x^a_k)           the dual stream: x plus every f_k
        y = x^a_{K+1} + LN_final(x^d_{K+1})

    The dual stream is what a Pre-LN stack's residual carries, input included; started at
    zero instead (x^d_1 = 0), this test fails."""
    torch.manual_seed(0)
    blocks = block_stack(2, dim=16, num_heads=2, norm_place="residual").eval()
    final = torch.nn.LayerNorm(16)
    with torch.no_grad():
        for m in [*blocks, final]:
            for n in m.modules():
                if isinstance(n, torch.nn.LayerNorm):  # away from identity, so order shows
                    n.weight.uniform_(0.5, 1.5)
                    n.bias.normal_()
    x = torch.randn(2, 5, 16)
    want, d = x, x
    for b in blocks:
        a = b.attn(want)
        want, d = b.norm1(want + a), d + a
        m = b.mlp(want)
        want, d = b.norm2(want + m), d + m
    want = want + final(d)
    with torch.no_grad():
        torch.testing.assert_close(run_blocks(blocks, x, final), want)
        # pre norm: the same weights give x + f(LN(x)) per sublayer, then the final norm
        for b in blocks:
            b.place = NORM_PLACEMENTS["pre"]
        ref = x
        for b in blocks:
            ref = ref + b.attn(b.norm1(ref))
            ref = ref + b.mlp(b.norm2(ref))
        torch.testing.assert_close(run_blocks(blocks, x, final), final(ref))


def test_drop_path_keeps_expectation_and_mlps():
    torch.manual_seed(0)
    dp = DropPath(0.5).train()
    out = dp(torch.ones(20000, 1))
    assert set(out.unique().tolist()) == {0.0, 2.0}
    assert out.mean().item() == pytest.approx(1.0, abs=0.05)
    assert torch.equal(dp.eval()(torch.ones(3, 1)), torch.ones(3, 1))
    assert Mlp(8, 32)(torch.randn(2, 8)).shape == (2, 8)
    sw = SwiGLU(8, 16)
    assert sw.fc1.out_features == 32 and sw(torch.randn(2, 8)).shape == (2, 8)


def test_patch_embed_pads_to_whole_patches_and_layernorm2d():
    pe = PatchEmbed(4, 3, 8)
    assert pe(torch.randn(1, 3, 10, 13)).shape == (1, 3, 4, 8)
    assert pe.grid_size(10, 13) == (3, 4)
    ln = LayerNorm2d(6)
    x = torch.randn(2, 6, 3, 3)
    ref = torch.nn.functional.layer_norm(x.permute(0, 2, 3, 1), (6,), eps=1e-6).permute(0, 3, 1, 2)
    torch.testing.assert_close(ln(x), ref)


def test_position_tables_are_cached_per_grid_dtype_and_device_and_bounded():
    from vision_tfm.layers import pos_embed

    a = sincos_2d(3, 5, 8, dtype=torch.bfloat16)
    assert a is sincos_2d(3, 5, 8, dtype=torch.bfloat16)  # reused, not rebuilt
    assert a.dtype == torch.bfloat16 and torch.equal(a, sincos_2d(3, 5, 8).to(torch.bfloat16))
    assert sincos_2d(5, 3, 8) is not sincos_2d(3, 5, 8)
    sin, cos = rope_2d(4, 4, 8)
    assert rope_2d(4, 4, 8)[0] is sin and cos.dtype == torch.float32
    for n in range(1, 51):
        sincos_2d(n, 2, 8)
    assert len(pos_embed._TABLES) <= pos_embed._TABLES.max_entries


def test_a_table_first_built_under_inference_mode_still_trains():
    """RoPE's tables are saved for backward; an inference tensor there would raise."""
    import vision_tfm as vt
    from vision_tfm.layers import pos_embed

    pos_embed._TABLES.clear()
    m = vt.create_model("vit_test_avg_rope")
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        ref = m(x)
    out = m(x)
    out.sum().backward()
    assert torch.equal(out.detach(), ref)
    assert m.patch_embed.proj.weight.grad is not None
