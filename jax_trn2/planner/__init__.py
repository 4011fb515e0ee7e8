"""Planning a deployment from shapes alone: layouts, sweeps, training and serving figures,
and their tables."""
