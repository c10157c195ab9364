"""ResNet-18/34/50/101 with THOR or Momentum: ``train.py``, ``eval.py`` and their sources in ``src``."""
