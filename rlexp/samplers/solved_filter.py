"""Skip prompts the policy already solves: a prompt whose every completion was correct at a step is not drawn again
(issue 21's prompt filter; the online form of the easy-prompt filtering of Skywork-OR1 and POLARIS — a group that is all
correct gives GRPO no signal, so its rollout is wasted compute).

The trainer tells the sampler which prompts it solved (``observe``) after scoring each step's own rollouts; later
batches pass over them. When fewer unsolved prompts are left than a batch needs, the batch is filled with solved ones
(never a short batch). The solved set is kept in checkpoints."""

from __future__ import annotations

from rlexp.core.registry import SAMPLERS
from rlexp.samplers.feedback import GroupFeedback
from rlexp.samplers.feedback import record_key as _key
from rlexp.samplers.shuffle import PromptSampler


@SAMPLERS.register
class SolvedPromptFilter(PromptSampler):
    """The shuffled order of ``PromptSampler`` with the solved prompts passed over."""

    def __init__(self, records: list[dict], batch_size: int, seed: int, difficulty_window: int = 8):
        super().__init__(records, batch_size, seed, difficulty_window)
        self.solved: set[str] = set()
        self.skipped = 0  # prompts passed over by the last batch

    def observe(self, feedback: GroupFeedback) -> None:
        """Mark the prompts whose group was all correct."""
        super().observe(feedback)
        for record, done in zip(feedback.records, feedback.all_correct):
            if done:
                self.solved.add(_key(record))

    def metrics(self) -> dict[str, float]:
        return {
            **super().metrics(),
            "sampler/solved_prompts": float(len(self.solved)),
            "sampler/skipped": float(self.skipped),
        }

    def next_batch(self) -> list[dict]:
        unsolved = len(self.records) - len({_key(r) for r in self.records} & self.solved)
        if unsolved < self.batch_size:  # too few left: the plain order
            self.skipped = 0
            return super().next_batch()
        wanted, out, seen, skipped = self.batch_size, [], set(), 0
        saved = self.batch_size
        self.batch_size = 1
        try:
            while len(out) < wanted:
                record = super().next_batch()[0]
                key = _key(record)
                if key in self.solved or key in seen:
                    skipped += 1
                    continue
                seen.add(key)
                out.append(record)
        finally:
            self.batch_size = saved
        self.skipped = skipped
        return out

    def state_dict(self) -> dict:
        return {**super().state_dict(), "solved": sorted(self.solved)}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.solved = set(state.get("solved", []))
