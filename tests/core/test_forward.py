import pytest
import torch

from rlexp.core.forward import token_logprobs, trim_window
from rlexp.core.micro_batches import micro_batches
from rlexp.rollout.hf import HFRollout
from tests.conftest import chat_prompts


@pytest.fixture(scope="module")
def rollout_batch(tiny):
    torch.manual_seed(0)
    return tiny, HFRollout(max_new_tokens=10).generate(tiny.model, tiny.tokenizer, chat_prompts(tiny.tokenizer), 4)


def _forward(lm, out, share):
    lm.model.zero_grad()
    lp, ent = token_logprobs(
        lm.model,
        out.prompt_ids,
        out.prompt_mask,
        out.completion_ids,
        out.completion_mask,
        0.8,
        with_entropy=True,
        share_prompts=share,
    )
    (lp * out.completion_mask).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in lm.model.parameters() if p.grad is not None])
    return lp * out.completion_mask, ent * out.completion_mask, grads


def test_shared_prompt_forward_equals_full_forward(rollout_batch):
    """Running each distinct prompt once and reusing its KV cache gives the same log-probs,
    entropies and gradients as the full forward of every row."""
    lm, out = rollout_batch
    lp_full, ent_full, g_full = _forward(lm, out, share=False)
    lp_shared, ent_shared, g_shared = _forward(lm, out, share=True)
    assert torch.allclose(lp_shared, lp_full, atol=1e-5)
    assert torch.allclose(ent_shared, ent_full, atol=1e-4)
    assert float((g_shared - g_full).norm() / g_full.norm()) < 1e-5


def test_single_token_completions_share_prompts(rollout_batch):
    lm, out = rollout_batch
    c, cm = out.completion_ids[:, :1], torch.ones_like(out.completion_ids[:, :1])
    a, _ = token_logprobs(lm.model, out.prompt_ids, out.prompt_mask, c, cm, share_prompts=True)
    b, _ = token_logprobs(lm.model, out.prompt_ids, out.prompt_mask, c, cm, share_prompts=False)
    assert a.shape == (12, 1) and torch.allclose(a, b, atol=1e-5)


def test_micro_batches_cut_rows_by_length_longest_first():
    """Rows by length, ties in row order, whatever group they belong to (whole groups would pad rows
    1 and 5 to 9 and 5 tokens)."""
    lengths = torch.tensor([1, 5, 2, 3, 9, 1, 1, 2])
    assert [b.tolist() for b in micro_batches(8, 4, lengths)] == [[4, 1, 3, 2], [7, 0, 5, 6]]
    assert [b.tolist() for b in micro_batches(8, 0, lengths)] == [[4, 1, 3, 2, 7, 0, 5, 6]]
    assert [b.tolist() for b in micro_batches(3, 2)] == [[0, 1], [2]]
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])  # whole groups, by their longest completion
    assert [b.tolist() for b in micro_batches(8, 4, lengths, group_ids=groups)] == [[4, 5, 1, 0], [3, 2, 7, 6]]


@pytest.mark.parametrize(
    "lengths,share,plan,positions",
    [
        # rows by length: [0, 2] 2 prompts × 3 + 2 × 4 = 14, [1, 3] 2 × 3 + 2 × 1 = 8: 22;
        # whole groups:   [0, 1] 1 prompt × 3 + 2 × 4 = 11, [2, 3] 1 × 3 + 2 × 3 = 9: 20 — fewer
        ([4, 1, 3, 1], True, [[0, 1], [2, 3]], [11, 9]),
        # rows: [0, 2] 6 + 2 × 8 = 22, [1, 3] 6 + 2 = 8: 30; groups: [0, 1] 3 + 16 = 19, [2, 3] 3 + 14 = 17: 36
        ([8, 1, 7, 1], True, [[0, 2], [1, 3]], [22, 8]),
        ([4, 1, 3, 1], False, [[0, 2], [1, 3]], [14, 8]),  # one forward per row: by length, prompts counted per row
    ],
)
def test_plan_takes_the_cut_with_fewer_padded_positions(lengths, share, plan, positions):
    from rlexp.core.micro_batches import plan_micro_batches
    from tests.algorithms.batches import make_batch

    batch = make_batch([1.0, 0.0, 1.0, 0.0], [0, 0, 1, 1], lengths=lengths)
    batch.prompt_ids = torch.tensor([[7, 8, 9], [7, 8, 9], [4, 5, 6], [4, 5, 6]])
    mbs = plan_micro_batches(batch, 2, share_prompts=share)
    assert [mb.idx.tolist() for mb in mbs] == plan and [mb.positions for mb in mbs] == positions
    assert all((mb.prompt_groups is not None) == (share and plan == [[0, 1], [2, 3]]) for mb in mbs)


def test_micro_batches_token_budget_hand_computed():
    """Rows in length order (0, 3, 1, 2) fill a micro-batch while rows × (longest prompt + longest
    completion) stays within the budget: [0] 1 × (2 + 4) = 6, [0, 3] 2 × 6 = 12, [0, 3, 1] 3 × (3 + 4) = 21."""
    lengths, prompts = torch.tensor([4, 2, 1, 3]), torch.tensor([2, 3, 3, 1])
    cut = lambda size, budget: [b.tolist() for b in micro_batches(4, size, lengths, budget, prompts)]
    assert cut(0, 12) == [[0, 3], [1, 2]]  # [1, 2]: 2 × (3 + 2) = 10
    assert cut(0, 21) == [[0, 3, 1], [2]]
    assert cut(2, 100) == [[0, 3], [1, 2]]  # the row cap still holds
    assert cut(0, 3) == [[0], [3], [1], [2]]  # a row over the budget goes alone
    assert cut(0, None) == [[0, 3, 1, 2]]
    with pytest.raises(ValueError, match="max_tokens"):
        micro_batches(4, 0, lengths, 12)


def trim(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """The batch with the columns that are padding in every row dropped (the reference for the plan)."""
    start, end = trim_window(prompt_mask, completion_mask)
    return prompt_ids[:, start:], prompt_mask[:, start:], completion_ids[:, :end], completion_mask[:, :end], end


def test_trim_drops_all_padding_columns():
    pm = torch.tensor([[0, 0, 1], [0, 1, 1]])
    cm = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    p, pm2, c, cm2, end = trim(pm * 7, pm, cm * 3, cm)
    assert pm2.tolist() == [[0, 1], [1, 1]] and cm2.tolist() == [[1, 1], [1, 0]] and end == 2


def _reference(logits, tokens, temperature):
    logp_all = torch.log_softmax(logits.float() / temperature, -1)
    return logp_all.gather(-1, tokens[..., None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize(
    "dtype,temperature,chunk", [(torch.float64, 1.0, 7), (torch.float32, 0.7, 5), (torch.bfloat16, 1.3, 2**20)]
)
def test_selected_logprobs_match_full_log_softmax_values_and_gradients(dtype, temperature, chunk):
    """The chunked log-prob (custom backward) equals log_softmax + gather, in value and in gradient,
    whatever the chunking; the entropy equals −Σ p log p."""
    from rlexp.core.forward import selected_logprobs

    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 11, dtype=torch.float64) * 3).to(dtype)
    tokens = torch.randint(0, 11, (3, 5))
    weights = torch.randn(3, 5, dtype=torch.float64)
    a = logits.clone().requires_grad_(True)
    lp, ent = selected_logprobs(a, tokens, temperature, with_entropy=True, chunk_elements=chunk)
    (lp.double() * weights).sum().backward()
    b = logits.clone().requires_grad_(True)
    ref_lp, ref_ent = _reference(b, tokens, temperature)
    (ref_lp.double() * weights).sum().backward()
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert lp.dtype == torch.promote_types(dtype, torch.float32) and not ent.requires_grad
    assert torch.allclose(lp.double(), ref_lp.double(), atol=tol) and torch.allclose(
        ent.double(), ref_ent.double(), atol=tol
    )
    assert torch.allclose(a.grad.double(), b.grad.double(), atol=1e-2 if dtype == torch.bfloat16 else tol)


def test_selected_logprobs_hand_computed():
    """Two tokens, logits (0, ln 3) at τ = 1: p = (1/4, 3/4); log p(token 1) = ln 3/4,
    entropy = −(¼ ln ¼ + ¾ ln ¾); ∂ log p(1)/∂logits = onehot(1) − p = (−¼, ¼)."""
    import math

    from rlexp.core.forward import selected_logprobs

    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64, requires_grad=True)
    lp, ent = selected_logprobs(logits, torch.tensor([[1]]), 1.0, with_entropy=True)
    lp.sum().backward()
    assert lp.item() == pytest.approx(math.log(0.75))
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert logits.grad.flatten().tolist() == pytest.approx([-0.25, 0.25])


def test_micro_batch_plan_matches_trim_and_prompt_groups_match_unique(rollout_batch):
    """The host-side plan gives the same windows as ``trim``, and the shared forward gives the same
    log-probs with the plan's ``prompt_groups`` as with ``torch.unique`` on the device: rows of a
    micro-batch with one prompt share it, and one row alone has nothing to share. Padded positions count
    a shared prompt once."""
    from rlexp.core.batch import RolloutBatch
    from rlexp.core.micro_batches import plan_micro_batches

    lm, out = rollout_batch
    n = out.completion_ids.shape[0]
    batch = RolloutBatch(
        prompt_ids=out.prompt_ids,
        prompt_mask=out.prompt_mask,
        completion_ids=out.completion_ids,
        completion_mask=out.completion_mask,
        sampling_logprobs=out.logprobs,
        truncated=out.truncated,
        group_ids=torch.arange(n) // 4,
        prompts=[""] * n,
        completions=out.texts,
        records=[{}] * n,
    )
    shared_somewhere = False
    for mb in plan_micro_batches(batch, 4):
        i = mb.dev_idx
        _, labels = torch.unique(batch.prompt_ids[i], dim=0, return_inverse=True)
        if mb.prompt_groups is None:
            assert len(labels.unique()) == len(i)
        else:
            shared_somewhere = True
            assert torch.equal(labels[mb.prompt_groups.inverse], labels)  # same prompt as its group's row
            assert len(mb.prompt_groups.first) == len(labels.unique())
            assert torch.equal(labels[mb.prompt_groups.first].sort().values, labels.unique())
        unique_prompts = len(labels.unique())
        assert mb.positions == unique_prompts * (batch.prompt_ids.shape[1] - mb.start) + len(i) * mb.end
        for a, b in zip(
            mb.rows(batch),
            trim(batch.prompt_ids[i], batch.prompt_mask[i], batch.completion_ids[i], batch.completion_mask[i]),
        ):
            assert torch.equal(a, b) if torch.is_tensor(a) else a == b
        p, pm, c, cm, _ = mb.rows(batch)
        with torch.no_grad():
            lp_index, _ = token_logprobs(lm.model, p, pm, c, cm, 0.8, prompt_groups=mb.prompt_groups)
            lp_unique, _ = token_logprobs(lm.model, p, pm, c, cm, 0.8)
        assert torch.allclose(lp_index * cm, lp_unique * cm, atol=1e-6)
    assert shared_somewhere
    assert all(mb.prompt_groups is None for mb in plan_micro_batches(batch, 1))
    assert all(mb.prompt_groups is None for mb in plan_micro_batches(batch, 4, share_prompts=False))


def test_prompt_groups_from_host_labels():
    from rlexp.core.forward import PromptGroups

    g = PromptGroups.from_index(torch.tensor([5, 5, 2, 7, 2]), torch.device("cpu"))
    assert g.inverse.tolist() == [1, 1, 0, 2, 0]
    labels = torch.tensor([5, 5, 2, 7, 2])
    assert torch.equal(labels[g.first][g.inverse], labels)  # each row maps to a row with its prompt
    assert PromptGroups.from_index(torch.tensor([3, 1, 2]), torch.device("cpu")) is None


@pytest.mark.parametrize("share", [False, True])
def test_support_and_topk_log_probs_are_the_full_log_softmax_gathered(rollout_batch, share):
    """TROLL's sparse support: the log-probs on given ids and the top-K of each position, from the same forward as
    the sampled tokens' (shared-prompt path included), equal the full log-softmax gathered by hand."""
    lm, out = rollout_batch
    args = (lm.model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask, 0.8)
    n, t = out.completion_ids.shape
    support = torch.randint(0, lm.model.config.vocab_size, (n, t, 3))
    lp, _, extra = token_logprobs(*args, share_prompts=share, support=support, topk=4)
    plain, _ = token_logprobs(*args, share_prompts=False)
    assert torch.allclose(lp, plain, atol=1e-5)
    ids = torch.cat([out.prompt_ids, out.completion_ids], 1)
    attn = torch.cat([out.prompt_mask, out.completion_mask], 1)
    logits = lm.model(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).logits
    full = torch.log_softmax(logits[:, out.prompt_ids.shape[1] - 1 : -1].float() / 0.8, -1)
    m = out.completion_mask.bool()
    assert torch.allclose(extra["support_logp"][m], full.gather(-1, support)[m], atol=1e-4)
    top_lp, top_idx = full.topk(4, -1)
    assert torch.allclose(extra["topk_logp"][m], top_lp[m], atol=1e-4)
    assert (extra["topk_idx"][m][:, 0] == top_idx[m][:, 0]).float().mean() > 0.99
