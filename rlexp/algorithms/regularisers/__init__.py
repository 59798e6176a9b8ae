"""Regularisers beside the policy loss: KL to a reference (estimators and the reference model, frozen or
EMA) and entropy terms (high-entropy token selection; the entropy bonus is ``algorithm.entropy_coef``)."""
