"""BERT masked-LM pretraining with Lamb or THOR: ``train.py``, ``bert_model.py``, ``bert_data.py``."""
