"""ResNet model-zoo sources: network, configuration, data pipelines, schedules and callbacks."""
