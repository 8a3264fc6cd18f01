"""What a run leaves and shows: the run folder and its files, the logs, the terminal's epoch
table and summary, the learning curve and the metric loggers.

Bottom first: ``console`` (the terminal's one rewritten line) and ``display`` (metric names
and units as shown) import nothing of mtt; ``logs`` uses ``console``; ``run_folder``,
``terminal``, ``learning_curve`` and ``metric_loggers`` use those.
"""
