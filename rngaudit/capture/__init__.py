"""What runs inside training: the recorder, its instrumentation, call sites, fingerprints, names."""
