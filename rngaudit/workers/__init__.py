"""DataLoader worker streams: the static scan, the in-worker probe and the monitor."""
