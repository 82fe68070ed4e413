"""Route: model, adapter, tools, placement and experiment variant, with the reasons recorded
(`policy`, `experiments`)."""
