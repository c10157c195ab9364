"""ms_optim's benchmarks: scripts run as files from a checkout; shared helpers in ``benchmarks._common``."""
