"""What every stage of a step shares, below all of them: the batch type (``batch``), the loss mask
(``masks``), group statistics (``stats``), the training forward (``forward``: sequence inputs,
attention masks, token log-probs), micro-batch plans (``micro_batches``) and the part registries
(``registry``). Nothing here imports the trainer, the rollout, the parts or a command."""
