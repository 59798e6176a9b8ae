"""Sampling from a local causal LM outside training: the offline builders of data a method needs before it trains
(KLCF's fact checklists: ``rlexp.data.checklists``; Co-Reward's rephrased questions: ``rlexp.data.paraphrases``).

A sampler is a callable ``(texts, k) -> k completions per text``; ``hf_sampler`` wraps a loaded model,
``lazy_model_sampler`` a ``model/`` config node whose model loads at the first call (a builder whose cache already
holds every answer never loads it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Sampler = Callable[[Sequence[str], int], list[list[str]]]  # (texts, k) -> k completions per text


def hf_sampler(
    model,
    tokenizer,
    max_new_tokens: int = 256,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 4,
    system_prompt: str | None = None,
    do_sample: bool = True,
    reply_prefix: str = "",
) -> Sampler:
    """A sampler over a loaded causal LM: each question chat-templated (when the tokenizer has a template) and
    answered ``k`` times by ``model.generate`` (``do_sample``, ``temperature``, ``top_p``), seeded from ``seed``.
    ``do_sample=False``: greedy decoding (``temperature`` and ``top_p`` unused; a judge's verdict). ``reply_prefix``:
    text the reply starts with (after the assistant turn's opening; a judge's ``Score:``), not part of the output."""

    def render(q: str) -> str:
        if getattr(tokenizer, "chat_template", None):
            msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + [
                {"role": "user", "content": q}
            ]
            return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) + reply_prefix
        return q + reply_prefix

    @torch.no_grad()
    def sample(questions: Sequence[str], k: int) -> list[list[str]]:
        device = next(model.parameters()).device
        side = tokenizer.padding_side
        tokenizer.padding_side = "left"
        out: list[list[str]] = []
        try:
            for i in range(0, len(questions), batch_size):
                chunk = [render(q) for q in questions[i : i + batch_size]]
                enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
                torch.manual_seed(seed + i)  # each chunk's draws depend on the seed and the chunk only
                how = {"do_sample": False}
                if do_sample:
                    how = {"do_sample": True, "temperature": temperature, "top_p": top_p}
                ids = model.generate(
                    **enc,
                    **how,
                    max_new_tokens=max_new_tokens,
                    num_return_sequences=k,
                    pad_token_id=tokenizer.pad_token_id,
                )
                texts = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
                out += [texts[j * k : (j + 1) * k] for j in range(len(chunk))]
        finally:
            tokenizer.padding_side = side
        return out

    return sample


class lazy_model_sampler:  # noqa: N801 — used like the function it replaces
    """``hf_sampler`` over the model a ``model/`` config node describes (its ``peft`` dropped: the plain base model),
    loaded on ``device`` (``auto``: CUDA when there is one) at the first call. ``sampling``: ``hf_sampler``'s
    settings."""

    def __init__(self, model_cfg, device: str = "auto", **sampling):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_container(model_cfg, resolve=True) if OmegaConf.is_config(model_cfg) else dict(model_cfg)
        cfg.pop("peft", None)
        self.cfg, self.sampling = cfg, sampling
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.model_name = cfg.get("name")
        self._sample: Sampler | None = None

    def __call__(self, texts: Sequence[str], k: int) -> list[list[str]]:
        if self._sample is None:
            from omegaconf import OmegaConf

            from rlexp.models.loading import load_model

            lm = load_model(OmegaConf.create(self.cfg), torch.device(self.device))
            self._sample = hf_sampler(lm.model.eval(), lm.tokenizer, **self.sampling)
        return self._sample(texts, k)
