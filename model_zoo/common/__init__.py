"""Pieces every model_zoo trainer shares: one-line command-line errors (``cli``), checkpoints that
never hold non-finite values (``checkpoint``) and progress lines (``progress``)."""
