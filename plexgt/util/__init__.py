"""The bottom utilities every layer may use: files written atomically and read safely, the
progress bar, what the machine has. They know nothing of graphs, models or ranks."""
