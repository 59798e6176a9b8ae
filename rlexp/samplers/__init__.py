"""Prompt samplers: which prompts a step trains on, in what order (config group ``sampler``). A sampler
is built as ``sampler(records, batch_size, seed)`` and is resumable (``state_dict``/``load_state_dict``)."""
