"""What reads reports offline: the report model, its files, loading, diffs, renderers."""
