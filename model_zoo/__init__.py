"""ms_optim's model zoo: training scripts run as files from a checkout (see model_zoo/README.md)."""
