"""Optimisers beside torch's own (``conf/optimizer/<name>.yaml``), one module per family."""
