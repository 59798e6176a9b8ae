"""Assembling a run from a composed config: ``setup`` (seeds, device, provenance, trackers),
``training`` (``rlexp train``), ``evaluation`` (``rlexp eval``)."""
