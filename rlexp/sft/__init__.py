"""The SFT stage (issue 25): ``rlexp train stage=sft`` fine-tunes the policy on prompt-completion examples through
TRL's SFTTrainer inside our run. ``method`` is the algorithm node (where the examples come from, TRL's SFT
settings), ``data`` builds the examples (demonstrations, or a model's own correct samples: re-distillation),
``metrics`` TRL's log names in ours, ``runner`` the run. ``rlexp pipeline`` (``rlexp.runs.pipeline``) chains it with
RL stages."""
