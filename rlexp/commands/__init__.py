"""The ``rlexp`` commands, one thin module each over library code: ``train``, ``evaluate`` (``rlexp eval``),
``listing`` (``rlexp list``), ``compare``, ``reproduce``, ``replay``, ``bench``. ``rlexp.cli`` dispatches to them."""
