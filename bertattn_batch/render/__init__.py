"""The rendering stage: pictures of one review (``plot.py``: ``plot_review``, ``bertattn plot``) and one
self-contained HTML page per run (``report.py``: ``build_report``, ``bertattn report``)."""
